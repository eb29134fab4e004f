// OpenMP when the build found it, a single thread otherwise (internal).
#pragma once

#define ORSD_PRAGMA(x) _Pragma(#x)
#ifdef _OPENMP
#define ORSD_OMP_PARALLEL_FOR(n) ORSD_PRAGMA(omp parallel for schedule(static) num_threads(n))
#else
#define ORSD_OMP_PARALLEL_FOR(n)
#endif

namespace orsd::cpu {
// Work below `grain` elements runs on the calling thread: waking a team costs more, and on a
// busy machine a team's barrier can wait a whole scheduler slice for a descheduled thread.
constexpr long kParallelGrain = 1 << 15;        // elements going through exp
constexpr long kElementwiseGrain = 1 << 20;     // a few ns of work each
inline int threads_for(long work, int requested, long grain = kParallelGrain) {
  if (requested < 1 || work < grain) return 1;
  return requested;
}
}  // namespace orsd::cpu
