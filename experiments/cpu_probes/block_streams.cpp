// Read bandwidth of the one-row quantized tile's access pattern: each thread reads its blocks (BLOCK bytes each) one
// after another, a block as S streams of BLOCK / S bytes read side by side, 64 bytes of each in turn (S = 1, 2, 4, 8;
// the AVX2 layout reads a 4-bit block as 2 streams, an 8-bit one as 4). Best of RUNS reads of 512 MiB each, the kinds
// alternated.
//   g++ -O3 -mavx2 -fopenmp experiments/cpu_probes/block_streams.cpp -o /tmp/block_streams
//   /tmp/block_streams THREADS RUNS BLOCK   (a Q4_0 block of 64 rows at K = 2048: 73728 bytes)
#include <immintrin.h>
#include <omp.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
static double once(const char* buf, size_t bytes, size_t block, int streams, int threads) {
  auto t0 = std::chrono::steady_clock::now();
  int sink = 0;
#pragma omp parallel num_threads(threads) reduction(|: sink)
  {
    const size_t share = bytes / threads, blocks = share / block, per = block / streams;
    const char* base = buf + omp_get_thread_num() * share;
    __m256i a = _mm256_setzero_si256(), b = a;
    for (size_t bl = 0; bl < blocks; ++bl) {
      const char* blk = base + bl * block;
      for (size_t at = 0; at < per; at += 64)
        for (int s = 0; s < streams; ++s) {
          const char* l = blk + s * per + at;
          a = _mm256_or_si256(a, _mm256_load_si256((const __m256i*)l));
          b = _mm256_or_si256(b, _mm256_load_si256((const __m256i*)(l + 32)));
        }
    }
    sink |= _mm256_extract_epi32(_mm256_or_si256(a, b), 0);
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (sink == 12345) printf(" ");
  return bytes / s;
}
int main(int argc, char** argv) {
  size_t bytes = 512ull << 20; int threads = atoi(argv[1]), runs = atoi(argv[2]); size_t block = atoll(argv[3]);
  char* buf = (char*)aligned_alloc(4096, bytes); memset(buf, 1, bytes);
  int ss[] = {1, 2, 4, 8}; double best[4] = {0};
  for (int r = 0; r < runs; ++r) for (int i = 0; i < 4; ++i) { double v = once(buf, bytes, block, ss[i], threads); if (v > best[i]) best[i] = v; }
  for (int i = 0; i < 4; ++i) printf("block %zu B, %d threads, %d streams: %.1f GB/s\n", block, threads, ss[i], best[i] / 1e9);
}
