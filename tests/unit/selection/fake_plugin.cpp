// A stand-in backend for the `kiln probe` end-to-end tests: it takes the name of a real backend
// (FAKE_NAME) and says it is available, with that backend's score (FAKE_SCORE), when a device of
// its kind (FAKE_KINDS) is offered, unless
// KILN_FAKE_UNAVAILABLE names it; so a test decides which plugins are installed (by the directory
// it passes) and which can run (by the environment).
#include <cstdlib>
#include <cstring>

#include <kiln/plugin_api.hpp>

namespace {

using namespace kiln::plugin;

bool named_unavailable() {
  const char* env = std::getenv("KILN_FAKE_UNAVAILABLE");
  if (!env) return false;
  const std::string list = std::string(",") + env + ",";
  return list.find(std::string(",") + FAKE_NAME + ",") != std::string::npos;
}

class FakePlugin : public Plugin {
 public:
  using Plugin::Plugin;

  static Descriptor describe() {
    Descriptor d;
    d.name = FAKE_NAME;
    d.version = "0.0.1";
    d.vendor = "kiln tests";
    d.description = "stand-in for the end-to-end probe tests";
    d.device_kinds = FAKE_KINDS;
    return d;
  }

  Availability available(const Devices& devices) override {
    if (named_unavailable()) return Availability::no("made unavailable by the test (KILN_FAKE_UNAVAILABLE)");
    for (size_t i = 0; i < devices.size(); ++i)
      if (FAKE_KINDS & KILN_DEVICE_KIND_BIT(devices[i].kind))
        return Availability::yes(std::string("fake, serving ") + devices[i].name, FAKE_SCORE);
    return Availability::no("no device of its kind");
  }

  std::vector<int64_t> claim(const Graph&) override { return {}; }
  std::unique_ptr<Executable> compile(const Graph&, const CompileOptions&) override {
    throw Unimplemented("a stand-in compiles nothing");
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(FakePlugin)
