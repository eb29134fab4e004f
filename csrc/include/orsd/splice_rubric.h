// splice_rubric: copy a packed batch of sequences into a new packing where sequence s gets rubric
// j = rubric_index[s] (if >= 0) inserted before its local position slots[s]. new_cu_seqlens is
// computed by the caller; pos_map[p] receives the new global position of old token p.
// Ids are copied as raw elements of elem_size bytes (4 or 8).
#pragma once

#include "orsd/common.h"

namespace orsd {

void splice_rubric_cpu(const void* ids, int elem_size, const int64_t* cu_seqlens,
                       int64_t num_seqs, const int64_t* slots, const void* rubric_ids,
                       const int64_t* rubric_cu, const int64_t* rubric_index,
                       const int64_t* new_cu_seqlens, void* new_ids, int64_t* pos_map,
                       int num_threads);

// One thread per new position; new_length = new_cu_seqlens[num_seqs].
void splice_rubric_cuda(const void* ids, int elem_size, const int64_t* cu_seqlens,
                        int64_t num_seqs, const int64_t* slots, const void* rubric_ids,
                        const int64_t* rubric_cu, const int64_t* rubric_index,
                        const int64_t* new_cu_seqlens, int64_t new_length, void* new_ids,
                        int64_t* pos_map, int device, StreamHandle stream);

}  // namespace orsd
