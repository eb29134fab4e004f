// Rubric splicing on CUDA: one thread per new position finds its sequence by binary search over
// new_cu_seqlens and copies from the old sequence or the rubric; old tokens also record pos_map.
#include "cuda_utils.cuh"
#include "orsd/splice_rubric.h"

namespace orsd {
namespace {

template <typename Id>
__global__ void splice_rubric_kernel(const Id* __restrict__ ids, const int64_t* __restrict__ cu_seqlens,
                                     int64_t num_seqs, const int64_t* __restrict__ slots,
                                     const Id* __restrict__ rubric_ids,
                                     const int64_t* __restrict__ rubric_cu,
                                     const int64_t* __restrict__ rubric_index,
                                     const int64_t* __restrict__ new_cu_seqlens, int64_t new_length,
                                     Id* __restrict__ new_ids, int64_t* __restrict__ pos_map) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < new_length;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // The last sequence s with new_cu_seqlens[s] <= p (empty sequences share offsets).
    int64_t lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (new_cu_seqlens[mid] <= p) lo = mid;
      else hi = mid - 1;
    }
    const int64_t s = lo;
    const int64_t local = p - new_cu_seqlens[s];
    const int64_t j = rubric_index[s];
    int64_t old = cu_seqlens[s] + local;
    if (j >= 0) {
      const int64_t slot = slots[s];
      const int64_t rubric_len = rubric_cu[j + 1] - rubric_cu[j];
      if (local >= slot && local < slot + rubric_len) {
        new_ids[p] = rubric_ids[rubric_cu[j] + local - slot];
        continue;
      }
      if (local >= slot) old -= rubric_len;
    }
    new_ids[p] = ids[old];
    pos_map[old] = p;
  }
}

template <typename Id>
void launch(const void* ids, const int64_t* cu_seqlens, int64_t num_seqs, const int64_t* slots,
            const void* rubric_ids, const int64_t* rubric_cu, const int64_t* rubric_index,
            const int64_t* new_cu_seqlens, int64_t new_length, void* new_ids, int64_t* pos_map,
            cudaStream_t stream) {
  splice_rubric_kernel<Id><<<cuda::grid_for(new_length), cuda::kThreads, 0, stream>>>(
      static_cast<const Id*>(ids), cu_seqlens, num_seqs, slots, static_cast<const Id*>(rubric_ids),
      rubric_cu, rubric_index, new_cu_seqlens, new_length, static_cast<Id*>(new_ids), pos_map);
  ORSD_CUDA_CHECK_LAUNCH("splice_rubric_kernel");
}

}  // namespace

void splice_rubric_cuda(const void* ids, int elem_size, const int64_t* cu_seqlens,
                        int64_t num_seqs, const int64_t* slots, const void* rubric_ids,
                        const int64_t* rubric_cu, const int64_t* rubric_index,
                        const int64_t* new_cu_seqlens, int64_t new_length, void* new_ids,
                        int64_t* pos_map, int device, StreamHandle stream) {
  if (num_seqs == 0 || new_length == 0) return;
  cuda::DeviceGuard guard(device);
  const cudaStream_t s = cuda::as_stream(stream);
  if (elem_size == 8) {
    launch<long long>(ids, cu_seqlens, num_seqs, slots, rubric_ids, rubric_cu, rubric_index,
                      new_cu_seqlens, new_length, new_ids, pos_map, s);
  } else if (elem_size == 4) {
    launch<int>(ids, cu_seqlens, num_seqs, slots, rubric_ids, rubric_cu, rubric_index,
                new_cu_seqlens, new_length, new_ids, pos_map, s);
  } else {
    throw std::invalid_argument("splice_rubric: ids must have 4- or 8-byte elements");
  }
}

}  // namespace orsd
