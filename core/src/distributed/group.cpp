// The data-parallel world: the torchrun environment, the TCPStore rendezvous, the Gloo (or NCCL)
// process group, registered under a name so that the functional collectives
// (_c10d_functional::all_reduce) find it.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/full.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "ddp.h"
#include "kiln/log.h"

namespace kiln::distributed {

#if KILN_HAVE_NCCL
// nccl_group.cpp: a ProcessGroupNCCL backend for this rank's CUDA device.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    int local_rank, std::chrono::milliseconds timeout);
#endif

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

int env_int(const char* name, int lo, int hi, int fallback) {
  const std::string text = env(name);
  if (text.empty()) return fallback;
  int v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  const SettingOrigin where{std::string("environment (") + name + ")", 0, 0};
  if (ec != std::errc() || end != text.data() + text.size())
    throw ConfigError(where, name, "'" + text + "' is not an integer");
  if (v < lo || v > hi)
    throw ConfigError(where, name, c10::str(name, " must be between ", lo, " and ", hi, ", got ", v));
  return v;
}

bool is_loopback(const std::string& addr) { return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1"; }

std::string bytes_text(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }
std::vector<uint8_t> text_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::atomic<int> next_group{0};

std::shared_ptr<Group> make_group(c10::intrusive_ptr<c10d::ProcessGroup> pg, c10::intrusive_ptr<c10d::Store> store,
                                  const std::string& backend, const TrainingArguments& args) {
  auto g = std::make_shared<Group>();
  g->pg = std::move(pg);
  g->store = std::move(store);
  g->backend = backend;
  g->rank = g->pg->getRank();
  g->size = g->pg->getSize();
  g->timeout = std::chrono::milliseconds(args.ddp_timeout * 1000);
  g->name = "kiln." + std::to_string(next_group++);
  c10d::register_process_group(g->name, g->pg);
  return g;
}

}  // namespace

Group::~Group() {
  try {
    c10d::unregister_process_group(name);
  } catch (...) {
  }
}

std::vector<std::string> Group::exchange(const std::string& topic, const std::string& value) {
  if (!store) throw DistributedError("kiln: no store to compare the ranks through");
  const std::string base = "kiln/" + name + "/" + topic + "#" + std::to_string(exchanges++) + "/";
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(base + std::to_string(r));
  try {
    store->set(keys[static_cast<size_t>(rank)], text_bytes(value));
    store->wait(keys, timeout);
  } catch (const std::exception& e) {
    std::string missing;
    try {
      for (int r = 0; r < size; ++r)
        if (!store->check({keys[static_cast<size_t>(r)]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    } catch (const std::exception&) {
      missing = "unknown (the store on rank 0 does not answer: rank 0 died or is unreachable)";
    }
    throw DistributedError(c10::str("kiln: rank ", rank, ": the ranks did not all reach '", topic,
                                    "' within ddp_timeout (", timeout.count() / 1000, " s); missing: rank ", missing,
                                    " (", e.what(), ")"));
  }
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(bytes_text(store->get(k)));
  return out;
}

std::string Group::diagnose(const std::string& topic) const {
  if (!store) return "no store to ask the other ranks through";
  const std::string base = "kiln/" + name + "/" + topic + "/";
  const auto wait = std::min(timeout, std::chrono::milliseconds(5000));
  const auto until = std::chrono::steady_clock::now() + wait;
  try {
    store->set(base + std::to_string(rank), text_bytes("alive"));
    std::vector<int> silent;
    for (;;) {
      silent.clear();
      for (int r = 0; r < size; ++r)
        if (r != rank && !store->check({base + std::to_string(r)})) silent.push_back(r);
      if (silent.empty() || std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (silent.empty()) return "every other rank is still running";
    std::string list;
    for (int r : silent) list += (list.empty() ? "" : ", ") + std::to_string(r);
    return c10::str("rank", silent.size() > 1 ? "s " : " ", list, " did not answer within ", wait.count() / 1000.0,
                    " s of this failure: it died, hangs, or is still blocked in the collective");
  } catch (const std::exception&) {
    return "the store on rank 0 does not answer: rank 0 died or is unreachable";
  }
}

WorldInfo world_from_env() {
  WorldInfo w;
  w.world_size = env_int("WORLD_SIZE", 1, 1 << 20, 1);
  if (w.world_size == 1) {
    // One process: rank 0 whatever RANK says; the rendezvous is used only where torchrun gave one
    // and a group of one is asked for (group_from_env).
    w.master_addr = env("MASTER_ADDR");
    const std::string port = env("MASTER_PORT");
    if (!port.empty()) w.master_port = env_int("MASTER_PORT", 1, 65535, 0);
    return w;
  }
  w.rank = env_int("RANK", 0, w.world_size - 1, 0);
  w.local_rank = env_int("LOCAL_RANK", 0, w.world_size - 1, 0);
  w.master_addr = env("MASTER_ADDR");
  w.master_port = env_int("MASTER_PORT", 1, 65535, 0);
  if (env("RANK").empty())
    throw ConfigError(
        {"environment (RANK)", 0, 0}, "RANK",
        c10::str("WORLD_SIZE is ", w.world_size, " but RANK is not set: start the program with torchrun"));
  if (w.master_addr.empty())
    throw ConfigError({"environment (MASTER_ADDR)", 0, 0}, "MASTER_ADDR",
                      "WORLD_SIZE > 1 needs MASTER_ADDR (the rendezvous host); torchrun sets it");
  if (w.master_port == 0)
    throw ConfigError({"environment (MASTER_PORT)", 0, 0}, "MASTER_PORT",
                      "WORLD_SIZE > 1 needs MASTER_PORT (the rendezvous port); torchrun sets it");
  return w;
}

std::shared_ptr<Group> group_from_env(const TrainingArguments& args, const std::string& device_type) {
  static std::mutex mu;
  static std::shared_ptr<Group> made;
  std::lock_guard<std::mutex> lock(mu);
  if (made) return made;
  const WorldInfo w = world_from_env();
  // A world of one makes no group, as accelerate does; unless WORLD_SIZE=1 is set and ddp_backend
  // names a backend: then the step runs its collectives over a group of one rank (what measuring or
  // testing the communication path on one device needs).
  if (w.world_size <= 1 && (args.ddp_backend.empty() || env("WORLD_SIZE").empty())) return nullptr;
  const std::string backend = !args.ddp_backend.empty() ? args.ddp_backend : device_type == "cuda" ? "nccl" : "gloo";
  const auto timeout = std::chrono::milliseconds(args.ddp_timeout * 1000);
  if (backend == "nccl") {
    const int devices = at::detail::getCUDAHooks().deviceCount();
    if (devices == 0)
      throw DistributedError(c10::str("kiln: rank ", w.rank,
                                      ": ddp_backend \"nccl\" needs a CUDA GPU and this process sees none; use "
                                      "ddp_backend = \"gloo\" to train on CPUs"));
#if !KILN_HAVE_NCCL
    throw DistributedError(c10::str("kiln: rank ", w.rank,
                                    ": ddp_backend \"nccl\": this kiln was built without NCCL (the CUDA toolkit or "
                                    "nccl.h was not found at build time); use ddp_backend = \"gloo\""));
#endif
  }
  // torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT and says so; otherwise rank 0 does.
  const bool agent_store = env("TORCHELASTIC_USE_AGENT_STORE") == "True";
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(w.master_port);
  so.isServer = !agent_store && w.rank == 0;
  so.numWorkers = agent_store ? std::nullopt : std::optional<std::size_t>(w.world_size);
  so.waitWorkers = !agent_store;
  so.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> tcp;
  try {
    // A world of one without a rendezvous address meets nobody: a store in this process.
    if (w.world_size == 1 && (w.master_addr.empty() || w.master_port == 0))
      tcp = c10::make_intrusive<c10d::HashStore>();
    else tcp = c10::make_intrusive<c10d::TCPStore>(w.master_addr, so);
  } catch (const std::exception& e) {
    throw DistributedError(c10::str("kiln: rank ", w.rank, ": the rendezvous at ", w.master_addr, ":", w.master_port,
                                    " failed within ddp_timeout (", args.ddp_timeout, " s): ", e.what()));
  }
  const std::string attempt = env("TORCHELASTIC_RESTART_COUNT").empty() ? "0" : env("TORCHELASTIC_RESTART_COUNT");
  auto store = c10::make_intrusive<c10d::PrefixStore>("kiln/attempt_" + attempt, tcp);
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(c10::make_intrusive<c10d::PrefixStore>("pg", store), w.rank,
                                                    w.world_size);
  try {
    if (backend == "gloo") {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      const std::string ifname = env("GLOO_SOCKET_IFNAME");
      if (!ifname.empty()) opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      else if (is_loopback(w.master_addr))
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      else opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      auto be = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", store),
                                                            w.rank, w.world_size, opts);
      pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, be);
      pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    } else {
#if KILN_HAVE_NCCL
      auto be = make_nccl_backend(c10::make_intrusive<c10d::PrefixStore>("nccl", store), w.rank, w.world_size,
                                  w.local_rank, timeout);
      pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, be);
      pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
#endif
    }
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& e) {
    throw DistributedError(c10::str("kiln: rank ", w.rank, ": making the ", backend, " process group of ", w.world_size,
                                    " ranks failed: ", e.what()));
  }
  made = make_group(pg, store, backend, args);
  log_info(c10::str("kiln: data-parallel rank ", w.rank, " of ", w.world_size, " (", backend, ", rendezvous ",
                    w.master_addr, ":", w.master_port, ")"));
  return made;
}

std::shared_ptr<Group> group_from(const c10::intrusive_ptr<c10d::ProcessGroup>& process_group,
                                  const TrainingArguments& args, const c10::intrusive_ptr<c10d::Store>& store) {
  if (!process_group) throw std::invalid_argument("kiln: the process group is null");
  std::string backend = process_group->getBackendName();
  for (auto& c : backend) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  c10::intrusive_ptr<c10d::Store> prefixed;
  if (store) prefixed = c10::make_intrusive<c10d::PrefixStore>("kiln", store);
  return make_group(process_group, prefixed, backend, args);
}

std::shared_ptr<Group> group_without_store(const c10::intrusive_ptr<c10d::ProcessGroup>& process_group,
                                           const TrainingArguments& args) {
  return group_from(process_group, args, c10::intrusive_ptr<c10d::Store>());
}

double Group::mean(double v, const std::string& what) const {
  // NCCL reduces device tensors only: the number goes to this rank's GPU and back.
  auto opts = at::TensorOptions().dtype(at::kDouble);
  if (backend == "nccl") opts = opts.device(at::Device(at::kCUDA, at::detail::getCUDAHooks().current_device()));
  std::vector<at::Tensor> t{at::full({1}, v, opts)};
  try {
    pg->allreduce(t)->wait();
  } catch (const std::exception& e) {
    throw DistributedError(c10::str("kiln: rank ", rank, ": all_reduce of ", what, " failed: ", e.what(), "; ",
                                    diagnose("failed." + what)));
  }
  return t[0].cpu().item<double>() / static_cast<double>(size);
}

int rank(const Group& group) { return group.rank; }
int world_size(const Group& group) { return group.size; }

}  // namespace kiln::distributed
