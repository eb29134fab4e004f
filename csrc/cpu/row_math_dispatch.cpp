// Picks the row-math table for the running CPU (see row_math.h).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "row_math.h"

namespace orsd::cpu {
namespace portable { extern const RowMath kRowMath; }
#ifdef ORSD_HAVE_ISA_AVX2
namespace avx2 { extern const RowMath kRowMath; }
#endif
#ifdef ORSD_HAVE_ISA_AVX512
namespace avx512 { extern const RowMath kRowMath; }
#endif

namespace {

bool cpu_supports(const RowMath* table) {
  const std::string name = table->isa;
  if (name == "portable") return true;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  if (name == "avx2")
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  if (name == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
  return false;
}

std::vector<const RowMath*> compiled_tables() {
  std::vector<const RowMath*> tables = {&portable::kRowMath};
#ifdef ORSD_HAVE_ISA_AVX2
  tables.push_back(&avx2::kRowMath);
#endif
#ifdef ORSD_HAVE_ISA_AVX512
  tables.push_back(&avx512::kRowMath);
#endif
  return tables;
}

const RowMath* find(const std::string& name) {
  for (const RowMath* t : compiled_tables())
    if (name == t->isa && cpu_supports(t)) return t;
  return nullptr;
}

const RowMath* initial_choice() {
  if (const char* forced = std::getenv("ORSD_CPU_ISA"); forced != nullptr && *forced != '\0') {
    if (const RowMath* t = find(forced)) return t;
    // An unusable request falls back to the best available set rather than failing import.
  }
  const RowMath* best = &portable::kRowMath;
  for (const RowMath* t : compiled_tables())
    if (cpu_supports(t)) best = t;
  return best;
}

std::atomic<const RowMath*>& current() {
  static std::atomic<const RowMath*> table{initial_choice()};
  return table;
}

}  // namespace

const RowMath& row_math() { return *current().load(std::memory_order_acquire); }

std::string row_math_isa() { return row_math().isa; }

std::vector<std::string> row_math_available() {
  std::vector<std::string> names;
  for (const RowMath* t : compiled_tables())
    if (cpu_supports(t)) names.emplace_back(t->isa);
  return names;
}

void set_row_math_isa(const std::string& name) {
  const RowMath* t = find(name);
  if (t == nullptr)
    throw std::invalid_argument("cpu isa '" + name +
                                "' is not compiled in or not supported by this CPU");
  current().store(t, std::memory_order_release);
}

float bf16_to_float(uint16_t bits) {
  uint32_t w = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}

float f16_to_float(uint16_t bits) {
  uint32_t w = bits;
  uint32_t magnitude = (w & 0x7fffu) << 13;
  float value;
  std::memcpy(&value, &magnitude, sizeof value);
  value *= 0x1p112f;
  uint32_t out;
  std::memcpy(&out, &value, sizeof out);
  if ((w & 0x7c00u) == 0x7c00u) out = magnitude | 0x7f800000u;
  out |= (w & 0x8000u) << 16;
  float result;
  std::memcpy(&result, &out, sizeof result);
  return result;
}

}  // namespace orsd::cpu
