#include "tools/bench.h"

namespace kjit::tools {

nlohmann::json BenchEntry(const BenchCase& c, const autotune::Timing& t, double copy_gbps) {
  const double gbps = c.bytes / (t.median_us * 1e3);
  nlohmann::json e = {{"op", c.op},
                      {"pass", c.pass},
                      {"shape", c.shape},
                      {"dtype", Name(c.dtype)},
                      {"config", c.config},
                      {"heuristic", c.heuristic},
                      {"median_us", t.median_us},
                      {"p10_us", t.p10_us},
                      {"p90_us", t.p90_us},
                      {"repeats", t.repeats},
                      {"bytes", c.bytes},
                      {"gbps", gbps},
                      {"ratio_to_copy", gbps / copy_gbps},
                      {"checked", true}};
  e.update(c.extra);
  return e;
}

}  // namespace kjit::tools
