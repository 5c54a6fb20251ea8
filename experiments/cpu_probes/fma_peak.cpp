// One core's float32 multiply-add peak on AVX2 + FMA, per second of the thread's CPU time (so that other processes
// on a shared machine, which take wall time, do not lower it): 12 independent 8-lane accumulators, enough to cover
// the multiply-add's latency on two pipes. The best of 5 runs.
//   g++ -O3 -mavx2 -mfma experiments/cpu_probes/fma_peak.cpp -o /tmp/fma_peak && /tmp/fma_peak
#include <immintrin.h>

#include <cstdio>
#include <ctime>

int main() {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(i * 0.001f);
  const __m256 scale = _mm256_set1_ps(0.999999f), shift = _mm256_set1_ps(1e-7f);
  const long iterations = 100000000;
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (long n = 0; n < iterations; ++n)
      for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], scale, shift);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    const double seconds = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    const double flops = iterations * 12.0 * 16 / seconds;  // 8 lanes x (multiply + add)
    if (flops > best) best = flops;
  }
  float sink = 0;
  for (int i = 0; i < 12; ++i) sink += _mm256_cvtss_f32(acc[i]);
  std::printf("float32 FMA peak of one core: %.1f GFLOP/s of CPU time (%.2f GHz at 32 flops a cycle) [%g]\n",
              best / 1e9, best / 32e9, sink);
}
