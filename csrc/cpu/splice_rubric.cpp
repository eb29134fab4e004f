// Rubric splicing on CPU: one sequence per loop iteration; each copies its prefix, the rubric
// and its suffix into the new packing and records where every old token went.
#include "orsd/splice_rubric.h"

#include <cstring>

#include "omp_compat.h"

namespace orsd {

void splice_rubric_cpu(const void* ids, int elem_size, const int64_t* cu_seqlens,
                       int64_t num_seqs, const int64_t* slots, const void* rubric_ids,
                       const int64_t* rubric_cu, const int64_t* rubric_index,
                       const int64_t* new_cu_seqlens, void* new_ids, int64_t* pos_map,
                       int num_threads) {
  const auto* src = static_cast<const unsigned char*>(ids);
  const auto* rubric = static_cast<const unsigned char*>(rubric_ids);
  auto* dst = static_cast<unsigned char*>(new_ids);
  const std::size_t esize = static_cast<std::size_t>(elem_size);
  const int threads = cpu::threads_for(static_cast<long>(cu_seqlens[num_seqs]), num_threads,
                                       cpu::kElementwiseGrain);
  (void)threads;

  ORSD_OMP_PARALLEL_FOR(threads)
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t begin = cu_seqlens[s], length = cu_seqlens[s + 1] - begin;
    const int64_t out = new_cu_seqlens[s];
    const int64_t j = rubric_index[s];
    const int64_t slot = j >= 0 ? slots[s] : length;
    const int64_t rubric_len = j >= 0 ? rubric_cu[j + 1] - rubric_cu[j] : 0;

    // memcpy with a null pointer is undefined even for 0 bytes (empty ids have no storage).
    auto copy = [esize](unsigned char* to, const unsigned char* from, int64_t count) {
      if (count > 0) std::memcpy(to, from, static_cast<std::size_t>(count) * esize);
    };
    copy(dst + out * esize, src + begin * esize, slot);
    if (rubric_len > 0) copy(dst + (out + slot) * esize, rubric + rubric_cu[j] * esize, rubric_len);
    copy(dst + (out + slot + rubric_len) * esize, src + (begin + slot) * esize, length - slot);
    for (int64_t i = 0; i < length; ++i)
      pos_map[begin + i] = out + i + (i >= slot ? rubric_len : 0);
  }
}

}  // namespace orsd
