// Memory read bandwidth of `threads` OpenMP threads, each reading its share of a buffer as 1, 4 or 8 interleaved
// streams (the kernels' one-row tile reads 4), with or without a software prefetch ahead: the best of `runs` reads of
// each kind, in GB/s (wall time: meaningful on a quiet machine only). For comparing with bench-shape's probe
// (torch's sum and byte max over 512 MiB), which sets the bandwidth bound.
//   g++ -O3 -mavx2 -fopenmp experiments/cpu_probes/read_bandwidth.cpp -o /tmp/read_bw && /tmp/read_bw 512 2 10
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

template <int HINT>
static double read_once(const char* buffer, size_t bytes, int threads, int streams, int distance) {
  const auto start = std::chrono::steady_clock::now();
  int sink = 0;
#pragma omp parallel num_threads(threads) reduction(| : sink)
  {
    const size_t share = bytes / threads, per_stream = share / streams;
    const char* base = buffer + omp_get_thread_num() * share;
    __m256i a = _mm256_setzero_si256(), b = a;
    for (size_t at = 0; at < per_stream; at += 64)
      for (int s = 0; s < streams; ++s) {
        const char* line = base + s * per_stream + at;
        if (distance) _mm_prefetch(line + distance, static_cast<_mm_hint>(HINT));
        a = _mm256_or_si256(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(line)));
        b = _mm256_or_si256(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(line + 32)));
      }
    sink |= _mm256_extract_epi32(_mm256_or_si256(a, b), 0);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (sink == 12345) std::printf(" ");
  return bytes / seconds;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: read_bw MIB THREADS RUNS\n");
    return 2;
  }
  const size_t bytes = static_cast<size_t>(std::atoll(argv[1])) << 20;
  const int threads = std::atoi(argv[2]), runs = std::atoi(argv[3]);
  char* buffer = static_cast<char*>(std::aligned_alloc(4096, bytes));
  std::memset(buffer, 1, bytes);  // pages mapped before any timed read
  struct Kind { const char* name; int streams, distance; };
  const Kind kinds[] = {{"1 stream", 1, 0}, {"4 streams", 4, 0}, {"8 streams", 8, 0},
                        {"4 streams, prefetch 512 B", 4, 512}, {"4 streams, prefetch 1 KiB", 4, 1024},
                        {"4 streams, prefetch 2 KiB", 4, 2048}};
  double best[6] = {0};
  for (int r = 0; r < runs; ++r)  // kinds alternate, so that a busy spell falls on all of them
    for (int i = 0; i < 6; ++i) {
      const double rate = read_once<_MM_HINT_T0>(buffer, bytes, threads, kinds[i].streams, kinds[i].distance);
      if (rate > best[i]) best[i] = rate;
    }
  for (int i = 0; i < 6; ++i)
    std::printf("%zu MiB, %d threads, %-26s %.1f GB/s\n", bytes >> 20, threads, kinds[i].name, best[i] / 1e9);
  std::free(buffer);
}
