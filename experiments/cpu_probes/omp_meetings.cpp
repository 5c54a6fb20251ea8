// What the threads' meetings cost: an empty OpenMP parallel region of two threads, an OpenMP barrier inside one
// region, and a sense-reversing spin barrier of two atomics, each the mean of 200,000 in a row (three repeats).
//   g++ -O2 -fopenmp experiments/cpu_probes/omp_meetings.cpp -o /tmp/omp_meetings && /tmp/omp_meetings
#include <omp.h>
#include <atomic>
#include <chrono>
#include <cstdio>
int main() {
  const int n = 200000; volatile int sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
#pragma omp parallel num_threads(2)
      { sink = sink + omp_get_thread_num(); }
    }
    auto t1 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(2)
    {
      for (int i = 0; i < n; ++i) {
#pragma omp barrier
      }
    }
    auto t2 = std::chrono::steady_clock::now();
    // a sense-reversing spin barrier of two threads
    std::atomic<int> count{0}; std::atomic<int> sense{0};
#pragma omp parallel num_threads(2)
    {
      int local = 0;
      for (int i = 0; i < n; ++i) {
        local ^= 1;
        if (count.fetch_add(1, std::memory_order_acq_rel) == 1) { count.store(0, std::memory_order_relaxed); sense.store(local, std::memory_order_release); }
        else while (sense.load(std::memory_order_acquire) != local) __builtin_ia32_pause();
      }
    }
    auto t3 = std::chrono::steady_clock::now();
    auto us = [&](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count() / n; };
    printf("region %.3f us, omp barrier %.3f us, spin barrier %.3f us\n", us(t0, t1), us(t1, t2), us(t2, t3));
  }
}
