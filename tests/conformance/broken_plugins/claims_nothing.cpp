// A backend that loads, says it is available on the CPU, and claims no node of any graph: kiln
// runs every step on its own eager executor, so training computes exactly eager's numbers while
// none of the plugin's code ever runs. Every case it can pass it passes (the ABI, availability and
// error cases), and every case that needs a claim skips, so before the suite looked at the whole
// run it was "18 passed, 23 skipped", exit 0; `kiln bench --check` said PASS with "runs on: eager".
// check_verdicts.cmake asserts that Workload.PluginRunsInSomeReferenceStep fails it, saying why,
// and check_bench.cmake that `kiln bench --check` fails it.
#include "test_plugin_support.h"

#ifndef PLUGIN_NAME
#error "define PLUGIN_NAME"
#endif

namespace {

using namespace test_plugin;

class ClaimsNothing : public CpuPlugin {
 public:
  using CpuPlugin::CpuPlugin;
  static Descriptor describe() { return cpu_descriptor(PLUGIN_NAME, "available on the CPU, claims no node"); }
  // Never called by kiln (nothing is claimed); a host that compiles anyway is told so.
  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    check_options(options);
    throw Unimplemented("compiles nothing (a group of " + std::to_string(g.num_nodes()) + " nodes)");
  }

 protected:
  bool takes(const Graph&, const Node&) const override { return false; }  // the defect
};

}  // namespace

KILN_DEFINE_PLUGIN(ClaimsNothing)
