// One rank of the data-parallel tests (ddp_test.cpp starts one process per rank, with the torchrun
// environment): trains ddp_scenario.h's model through kiln::Trainer on its share of every step's
// examples and saves its parameters. Arguments, all name=value:
//   seed, steps, adamw (0/1), compile (0/1), backend, sizes (per rank, "8,8"), timeout (s),
//   out (a path; "<out>.rank<r>" is written), die_rank/die_step (that rank exits at that step),
//   hang_rank/hang_step (that rank sleeps there), clip_rank (that rank clips its gradients: another
//   step), unused_rank (that rank leaves the head without a gradient), other_model_rank (that rank's
//   model has one parameter more), find_unused (0/1); train=1 runs Trainer::train on `examples`
//   examples with ga (gradient_accumulation_steps) instead of Trainer::step; own_group=1 hands the
//   Trainer a Gloo process group the worker made itself; device=cuda trains on the GPU of
//   LOCAL_RANK, mode is torch_compile_mode, ddp_backend the setting of that name, no_overlap=1 sets
//   debug.no_comm_overlap; the parameters are saved on the CPU.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/serialize.h>

#include "ddp_scenario.h"
#include "kiln/compile.h"
#include "kiln/distributed.h"
#include "kiln/trainer.h"

namespace ddp = kiln::test::ddp;

int main(int argc, char** argv) {
  std::map<std::string, std::string> o = {{"seed", "1"},         {"steps", "4"},       {"adamw", "0"},
                                          {"compile", "1"},      {"backend", "eager"}, {"sizes", "8,8"},
                                          {"timeout", "20"},     {"out", ""},          {"die_rank", "-1"},
                                          {"die_step", "-1"},    {"hang_rank", "-1"},  {"hang_step", "-1"},
                                          {"clip_rank", "-1"},   {"own_group", "0"},   {"train", "0"},
                                          {"ga", "1"},           {"examples", "48"},   {"other_model_rank", "-1"},
                                          {"unused_rank", "-1"}, {"find_unused", "0"}, {"device", "cpu"},
                                          {"mode", "default"},   {"ddp_backend", ""},  {"no_overlap", "0"}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    if (eq == std::string::npos || !o.count(a.substr(0, eq))) {
      std::cerr << "ddp_worker: unknown argument " << a << "\n";
      return 2;
    }
    o[a.substr(0, eq)] = a.substr(eq + 1);
  }
  auto num = [&](const char* k) { return std::stoll(o[k]); };
  const int rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "0");
  std::vector<int64_t> sizes;
  std::stringstream ss(o["sizes"]);
  for (std::string t; std::getline(ss, t, ',');) sizes.push_back(std::stoll(t));
  const auto seed = static_cast<uint64_t>(num("seed"));
  try {
    // Every rank starts from another model: the Trainer must broadcast rank 0's.
    ddp::Setup s = ddp::make(seed + 1000 * static_cast<uint64_t>(rank), num("adamw") != 0);
    // That rank's model has one parameter more.
    if (num("other_model_rank") == rank) s.net->register_parameter("extra", at::zeros({3}));
    const char* local = std::getenv("LOCAL_RANK");
    const at::Device device = o["device"] == "cuda"
                                  ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(std::atoi(local ? local : "0")))
                                  : at::Device(at::kCPU);
    s.net->to(device);  // in place: the optimizer keeps the same parameters
    kiln::TrainingArguments args;
    args.torch_compile = num("compile") != 0;
    if (args.torch_compile) args.torch_compile_backend = o["backend"];  // naming one turns compile on
    args.torch_compile_mode = o["mode"];
    args.ddp_backend = o["ddp_backend"];
    args.ddp_bucket_cap_mb = 1;
    args.debug.no_comm_overlap = num("no_overlap") != 0;
    args.ddp_timeout = num("timeout");
    args.ddp_find_unused_parameters = num("find_unused") != 0;
    if (num("clip_rank") == rank) args.max_grad_norm = 1e6;
    const bool unused = num("unused_rank") == rank;
    auto net = s.net;
    // own_group=1: the program makes its own Gloo process group and hands it over; the Trainer must
    // not join the torchrun world itself, so WORLD_SIZE goes first.
    c10::intrusive_ptr<c10d::ProcessGroup> own;
    c10::intrusive_ptr<c10d::Store> own_store;
    if (num("own_group") != 0) {
      const int world = std::atoi(std::getenv("WORLD_SIZE"));
      ::unsetenv("WORLD_SIZE");
      c10d::TCPStoreOptions so;
      so.port = static_cast<uint16_t>(std::atoi(std::getenv("MASTER_PORT")));
      so.isServer = rank == 0;
      so.numWorkers = world;
      so.timeout = std::chrono::seconds(num("timeout"));
      own_store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
      auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(num("timeout")));
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(own_store, rank, world, opts);
      own = c10::make_intrusive<c10d::ProcessGroup>(own_store, rank, world);
      own->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
      own->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    }
    kiln::Trainer trainer(
        net.ptr(), kiln::ForwardFn([net, unused](const at::Tensor& x) mutable {
          if (!unused) return net->forward(x);
          // The head gets no gradient: the output comes from the hidden layers alone.
          auto h = net[2]->as<torch::nn::Linear>()->forward(at::relu(net[0]->as<torch::nn::Linear>()->forward(x)));
          return h.narrow(1, 0, ddp::kClasses);
        }),
        *s.opt, ddp::loss, args);
    if (own) trainer.set_process_group(own, own_store);
    if (trainer.world_size() != static_cast<int>(sizes.size()) || trainer.process_index() != rank) {
      std::cerr << "ddp_worker: the Trainer sees rank " << trainer.process_index() << " of " << trainer.world_size()
                << "\n";
      return 2;
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (num("train") != 0) {
      // Trainer::train on a dataset every rank has whole: each rank trains on its share.
      auto [xs, ys] = ddp::examples(seed, num("examples"));
      kiln::TensorDataset data({xs}, ys);
      kiln::TrainingArguments a = trainer.args();
      // A folder of its own per rank, so that the test sees who wrote what: rank 0 alone may.
      ddp::train_settings(a, sizes[static_cast<size_t>(rank)], num("ga"), num("steps"),
                          o["out"] + "_run" + std::to_string(rank));
      a.save_strategy = "steps";
      a.save_steps = num("steps");
      kiln::Trainer t2(net.ptr(), kiln::ForwardFn([net](const at::Tensor& x) mutable { return net->forward(x); }),
                       *s.opt, ddp::loss, a);
      t2.train(data);
      std::vector<at::Tensor> params;
      for (const auto& p : net->parameters()) params.push_back(p.detach().clone());
      torch::save(params, o["out"] + ".rank" + std::to_string(rank));
      std::cout << "compiled_steps=" << t2.stats().compiled_steps << std::endl;
      return 0;
    }
    for (int64_t step = 0; step < num("steps"); ++step) {
      if (num("die_rank") == rank && num("die_step") == step) std::_Exit(3);
      if (num("hang_rank") == rank && num("hang_step") == step) std::this_thread::sleep_for(std::chrono::hours(1));
      auto b = ddp::batches(seed, step, sizes);
      trainer.step(b[static_cast<size_t>(rank)].first.to(device), b[static_cast<size_t>(rank)].second.to(device));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The collectives are nodes of the compiled graph: an all_reduce and its wait per bucket.
    // overlapped=1: the first all_reduce comes before the backward's last node (it overlaps the rest).
    int all_reduce = 0, wait = 0, first_reduce = -1, last_backward = -1;
    if (const kiln::ir::Graph* g = trainer.compiled_step().compiled_graph())
      for (size_t i = 0; i < g->nodes.size(); ++i) {
        const auto& n = g->nodes[i];
        all_reduce += n.op == "_c10d_functional::all_reduce";
        wait += n.op == "_c10d_functional::wait_tensor";
        if (n.op == "_c10d_functional::all_reduce" && first_reduce < 0) first_reduce = static_cast<int>(i);
        if (n.phase == kiln::ir::Phase::Backward) last_backward = static_cast<int>(i);
      }
    int groups = 0;
    for (const auto& g : trainer.stats().groups) groups += g.compiled;
    std::cout << "all_reduce_nodes=" << all_reduce << " wait_tensor_nodes=" << wait
              << " overlapped=" << (first_reduce >= 0 && first_reduce < last_backward) << " backend_groups=" << groups
              << " compiled_steps=" << trainer.stats().compiled_steps << " steps=" << trainer.stats().steps
              << " graphs_recorded=" << trainer.stats().graphs_recorded
              << " graph_replays=" << trainer.stats().graph_replays << " backend=" << trainer.backend()
              << " seconds=" << seconds << std::endl;
    if (!trainer.stats().last_graph_skip.empty())
      std::cout << "graph_skip: " << trainer.stats().last_graph_skip << "\n";
    if (!o["out"].empty()) {
      std::vector<at::Tensor> params;
      for (const auto& p : net->parameters()) params.push_back(p.detach().cpu().clone());
      torch::save(params, o["out"] + ".rank" + std::to_string(rank));
    }
  } catch (const kiln::DistributedError& e) {
    std::cerr << "DistributedError: " << e.what() << std::endl;
    return 4;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 5;
  }
  return 0;
}
