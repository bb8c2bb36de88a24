#include "checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <nlohmann/json.hpp>

#include "kiln/log.h"
#include "kiln/trainer.h"

namespace fs = std::filesystem;

namespace kiln::checkpoint {
namespace {

constexpr const char* kModel = "model.pt";
constexpr const char* kOptimizer = "optimizer.pt";
constexpr const char* kScheduler = "scheduler.pt";
constexpr const char* kRng = "rng_state.pt";
constexpr const char* kTrainerState = "trainer_state.pt";
constexpr const char* kTrainerStateJson = "trainer_state.json";

const std::regex& checkpoint_re() {
  static const std::regex re("checkpoint-([0-9]+)");
  return re;
}

// The first line of a LibTorch error, without the C++ stack LibTorch appends.
std::string short_error(const std::exception& e) {
  const auto* c10e = dynamic_cast<const c10::Error*>(&e);
  std::string m = c10e ? c10e->msg() : e.what();
  const size_t nl = m.find('\n');
  return nl == std::string::npos ? m : m.substr(0, nl);
}

std::string shape_text(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

// fsync a file or a folder, so that a rename after it publishes complete data.
void sync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("kiln::Trainer: cannot open " + p.string() + ": " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw std::runtime_error("kiln::Trainer: cannot sync " + p.string() + ": " + std::strerror(err));
}

at::Generator cpu_generator() { return at::detail::getDefaultCPUGenerator(); }

int64_t cuda_devices() { return at::hasCUDA() ? at::detail::getCUDAHooks().getNumGPUs() : 0; }

at::Generator cuda_generator(int64_t i) {
  return at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
}

at::Tensor state_of(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// A file-size limit (ulimit -f, RLIMIT_FSIZE) ends a process whose write goes past it with
// SIGXFSZ, whose default action kills it, leaving the temporary folder behind. While a checkpoint
// or a model is written the signal is ignored, so such a write fails with EFBIG instead and is
// reported like a full disk; the disposition before is put back after. (Process-wide, as signal
// dispositions are: another thread writing past the limit meanwhile also gets EFBIG.)
class FileSizeLimitIsAnError {
 public:
  FileSizeLimitIsAnError() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    saved_ = ::sigaction(SIGXFSZ, &ignore, &old_) == 0;
  }
  ~FileSizeLimitIsAnError() {
    if (saved_) ::sigaction(SIGXFSZ, &old_, nullptr);
  }
  FileSizeLimitIsAnError(const FileSizeLimitIsAnError&) = delete;
  FileSizeLimitIsAnError& operator=(const FileSizeLimitIsAnError&) = delete;

 private:
  struct sigaction old_ {};
  bool saved_ = false;
};

// Writes an archive into `p` through kiln's own checked writes, then syncs it. LibTorch's writer
// to a file name cannot be trusted with a failing disk: when a write fails (no space left, a file
// size limit) its archive writer throws, and its destructor then writes the archive's end again and
// throws a second time, which ends the process (std::terminate). Here LibTorch always hears that
// its bytes were taken; the first failure is kept, the rest of the archive is not written, and the
// failure is reported (with errno's reason) once LibTorch is done.
void write_archive(torch::serialize::OutputArchive& ar, const fs::path& p) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError(p.string(), std::string("cannot be created: ") + std::strerror(errno));
  int failure = 0;
  std::string buffer;  // small records gathered into writes of 1 MiB or more
  auto flush = [&](const char* data, size_t n) {
    while (n > 0 && failure == 0) {
      const ssize_t w = ::write(fd, data, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        failure = w < 0 ? errno : EIO;
        break;
      }
      data += w;
      n -= static_cast<size_t>(w);
    }
  };
  try {
    ar.save_to([&](const void* data, size_t n) -> size_t {
      if (failure != 0) return n;
      if (data == nullptr) {  // LibTorch asks to skip n bytes (a record written elsewhere)
        flush(buffer.data(), buffer.size());
        buffer.clear();
        if (failure == 0 && ::lseek(fd, static_cast<off_t>(n), SEEK_CUR) < 0) failure = errno;
        return n;
      }
      buffer.append(static_cast<const char*>(data), n);
      if (buffer.size() >= (size_t{1} << 20)) {
        flush(buffer.data(), buffer.size());
        buffer.clear();
      }
      return n;
    });
    flush(buffer.data(), buffer.size());
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (failure == 0 && ::fsync(fd) != 0) failure = errno;
  if (::close(fd) != 0 && failure == 0) failure = errno;
  if (failure != 0) throw CheckpointError(p.string(), std::string("could not be written: ") + std::strerror(failure));
}

// Opens one file of the checkpoint, or says why not.
void open_archive(const fs::path& file, torch::serialize::InputArchive& ar, std::optional<c10::Device> device) {
  if (!fs::exists(file)) throw CheckpointError(file.string(), "missing: the checkpoint is incomplete");
  try {
    ar.load_from(file.string(), device);
  } catch (const std::exception& e) {
    throw CheckpointError(file.string(), "cannot be read (truncated, or not a file kiln wrote): " + short_error(e));
  }
}

c10::IValue read_value(torch::serialize::InputArchive& ar, const fs::path& file, const std::string& key) {
  c10::IValue v;
  if (!ar.try_read(key, v)) throw CheckpointError(file.string(), "has no '" + key + "'");
  return v;
}

int64_t read_int(torch::serialize::InputArchive& ar, const fs::path& file, const std::string& key) {
  const auto v = read_value(ar, file, key);
  if (!v.isInt()) throw CheckpointError(file.string(), "'" + key + "' is not an integer");
  return v.toInt();
}

double read_double(torch::serialize::InputArchive& ar, const fs::path& file, const std::string& key) {
  const auto v = read_value(ar, file, key);
  if (!v.isDouble()) throw CheckpointError(file.string(), "'" + key + "' is not a number");
  return v.toDouble();
}

std::string read_string(torch::serialize::InputArchive& ar, const fs::path& file, const std::string& key) {
  const auto v = read_value(ar, file, key);
  if (!v.isString()) throw CheckpointError(file.string(), "'" + key + "' is not a string");
  return v.toStringRef();
}

// An optional tensor: undefined when the key is absent.
at::Tensor read_tensor(torch::serialize::InputArchive& ar, const fs::path& file, const std::string& key,
                       bool required) {
  at::Tensor t;
  if (!ar.try_read(key, t, /*is_buffer=*/true) && required)
    throw CheckpointError(file.string(), "has no tensor '" + key + "'");
  return t;
}

// Every parameter and buffer of `module` (under `prefix`) read from `ar` and checked against the
// module's: the same names, shapes and dtypes, nothing more and nothing less. Collects (target,
// value) pairs; changes nothing.
void read_module(const torch::nn::Module& module, torch::serialize::InputArchive& ar, const std::string& prefix,
                 const fs::path& file, std::vector<std::pair<at::Tensor, at::Tensor>>& out) {
  std::vector<std::string> known;
  auto take = [&](const std::string& name, const at::Tensor& target, bool is_buffer) {
    known.push_back(name);
    const std::string what = (is_buffer ? "buffer '" : "parameter '") + prefix + name + "'";
    at::Tensor value;
    if (!ar.try_read(name, value, is_buffer))
      throw CheckpointError(file.string(), "has no " + what + ": the checkpoint is of another model");
    if (value.sizes() != target.sizes())
      throw CheckpointError(file.string(), what + " has shape " + shape_text(value.sizes()) + " in the checkpoint, " +
                                               shape_text(target.sizes()) + " in the model");
    if (value.scalar_type() != target.scalar_type())
      throw CheckpointError(file.string(), what + " is " + std::string(c10::toString(value.scalar_type())) +
                                               " in the checkpoint, " + c10::toString(target.scalar_type()) +
                                               " in the model");
    out.emplace_back(target, value);
  };
  for (const auto& p : module.named_parameters(/*recurse=*/false)) take(p.key(), p.value(), false);
  for (const auto& b : module.named_buffers(/*recurse=*/false)) take(b.key(), b.value(), true);
  for (const auto& c : module.named_children()) {
    if (!c.value()->is_serializable()) continue;
    known.push_back(c.key());
    torch::serialize::InputArchive sub;
    if (!ar.try_read(c.key(), sub))
      throw CheckpointError(file.string(),
                            "has no submodule '" + prefix + c.key() + "': the checkpoint is of another model");
    read_module(*c.value(), sub, prefix + c.key() + ".", file, out);
  }
  for (const auto& k : ar.keys())
    if (k != "training" && std::find(known.begin(), known.end(), k) == known.end())
      throw CheckpointError(file.string(), "holds '" + prefix + k +
                                               "', which the model does not have: the checkpoint is of another model");
}

std::optional<c10::Device> device_of(const torch::nn::Module& model) {
  for (const auto& p : model.parameters()) return p.device();
  for (const auto& b : model.buffers()) return b.device();
  return std::nullopt;
}

// Loads optimizer.pt into the optimizer; on any error the optimizer's state and options are put
// back as they were.
void load_optimizer(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& ar, const fs::path& file) {
  using State = ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>>;
  State saved_state;
  for (auto& [key, st] : optimizer.state()) saved_state[key] = st->clone();
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> saved_options;
  for (auto& g : optimizer.param_groups()) saved_options.push_back(g.options().clone());
  // A parameter without state in the checkpoint has none after the load either.
  optimizer.state().clear();
  try {
    optimizer.load(ar);
  } catch (const std::exception& e) {
    optimizer.state() = std::move(saved_state);
    for (size_t i = 0; i < saved_options.size(); ++i)
      optimizer.param_groups()[i].set_options(std::move(saved_options[i]));
    throw CheckpointError(
        file.string(), "does not fit this optimizer (another optimizer, or other parameter groups): " + short_error(e));
  }
}

// Every file of a checkpoint into the folder `tmp`, each synced, then the folder.
void write_folder(const fs::path& tmp, const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                  const LoopState& loop, const std::string& trainer_state_json) {
  fs::create_directories(tmp);
  {
    torch::serialize::OutputArchive ar;
    model.save(ar);
    write_archive(ar, tmp / kModel);
  }
  {
    torch::serialize::OutputArchive ar;
    optimizer.save(ar);
    write_archive(ar, tmp / kOptimizer);
  }
  {
    torch::serialize::OutputArchive ar;
    ar.write("lr_scheduler_type", c10::IValue(loop.schedule.type));
    // "learning_rate": the first group's peak, as checkpoints before base_lrs held it for all.
    ar.write("learning_rate", c10::IValue(loop.schedule.peak_lrs.empty() ? 0.0 : loop.schedule.peak_lrs[0]));
    ar.write("base_lrs", c10::IValue(c10::List<double>(loop.schedule.peak_lrs)));
    ar.write("warmup_steps", c10::IValue(loop.schedule.warmup_steps));
    ar.write("total_steps", c10::IValue(loop.schedule.total_steps));
    ar.write("last_step", c10::IValue(loop.global_step));
    if (!loop.schedule.plateau_lrs.empty()) {
      ar.write("plateau_lrs", c10::IValue(c10::List<double>(loop.schedule.plateau_lrs)));
      ar.write("plateau_best", c10::IValue(loop.schedule.plateau_best));
      ar.write("plateau_num_bad_epochs", c10::IValue(loop.schedule.plateau_bad));
      ar.write("plateau_cooldown_counter", c10::IValue(loop.schedule.plateau_cooldown));
    }
    if (loop.schedule.loss_scale > 0) {
      ar.write("skipped_steps", c10::IValue(loop.schedule.skipped_steps));
      ar.write("loss_scale", c10::IValue(loop.schedule.loss_scale));
      ar.write("scale_growth_tracker", c10::IValue(loop.schedule.scale_growth_tracker));
    }
    write_archive(ar, tmp / kScheduler);
  }
  {
    torch::serialize::OutputArchive ar;
    ar.write("cpu", state_of(cpu_generator()), /*is_buffer=*/true);
    const int64_t n = cuda_devices();
    ar.write("cuda/count", c10::IValue(n));
    for (int64_t i = 0; i < n; ++i) ar.write("cuda/" + std::to_string(i), state_of(cuda_generator(i)), true);
    ar.write("data_order", loop.data_order_state, true);
    write_archive(ar, tmp / kRng);
  }
  {
    torch::serialize::OutputArchive ar;
    ar.write("global_step", c10::IValue(loop.global_step));
    ar.write("epoch", c10::IValue(loop.epoch));
    ar.write("step_in_epoch", c10::IValue(loop.step_in_epoch));
    ar.write("epoch_end_pending", c10::IValue(static_cast<int64_t>(loop.epoch_end_pending)));
    ar.write("epoch_progress", c10::IValue(loop.epoch_progress));
    if (loop.total_loss.defined()) ar.write("total_loss", loop.total_loss, true);
    if (loop.interval_loss.defined()) ar.write("interval_loss", loop.interval_loss, true);
    ar.write("interval_steps", c10::IValue(loop.interval_steps));
    ar.write("log_history", c10::IValue(c10::List<std::string>(loop.log_history)));
    ar.write("layouts", c10::IValue(c10::List<std::string>(loop.layouts)));
    ar.write("dataset_size", c10::IValue(loop.dataset_size));
    ar.write("per_device_train_batch_size", c10::IValue(loop.per_device_train_batch_size));
    ar.write("gradient_accumulation_steps", c10::IValue(loop.gradient_accumulation_steps));
    ar.write("seed", c10::IValue(loop.seed));
    ar.write("group_by_length", c10::IValue(static_cast<int64_t>(loop.group_by_length)));
    if (loop.best_metric) ar.write("best_metric", c10::IValue(*loop.best_metric));
    ar.write("best_model_checkpoint", c10::IValue(loop.best_model_checkpoint));
    write_archive(ar, tmp / kTrainerState);
  }
  {
    const fs::path p = tmp / kTrainerStateJson;
    std::ofstream f(p, std::ios::trunc);
    f << trainer_state_json;
    f.close();
    if (!f) {
      const int err = errno;
      throw CheckpointError(p.string(),
                            std::string("could not be written") + (err ? std::string(": ") + std::strerror(err) : ""));
    }
    sync_path(p);
  }
  sync_path(tmp);
}

}  // namespace

std::string save_model(const std::string& dir, const torch::nn::Module& model) {
  const fs::path d(dir), tmp = fs::path(dir) / "model.pt.tmp", file = fs::path(dir) / kModel;
  std::error_code ec;
  fs::create_directories(d, ec);
  if (ec) throw CheckpointError(dir, "cannot be made: " + ec.message());
  torch::serialize::OutputArchive ar;
  model.save(ar);
  {
    const FileSizeLimitIsAnError limit;
    write_archive(ar, tmp);
  }
  fs::rename(tmp, file, ec);
  if (ec) throw CheckpointError(file.string(), "cannot be written: " + ec.message());
  return file.string();
}

std::string folder_name(int64_t global_step) { return "checkpoint-" + std::to_string(global_step); }

std::string save(const std::string& output_dir, const torch::nn::Module& model,
                 const torch::optim::Optimizer& optimizer, const LoopState& loop,
                 const std::string& trainer_state_json) {
  const fs::path out(output_dir);
  fs::create_directories(out);
  // Temporary folders of a run that stopped while writing: never complete, never resumed from.
  for (const auto& e : fs::directory_iterator(out))
    if (e.is_directory() && e.path().filename().string().rfind("tmp-checkpoint-", 0) == 0) fs::remove_all(e.path());
  const std::string name = folder_name(loop.global_step);
  const fs::path final_dir = out / name, tmp = out / ("tmp-" + name);
  try {
    const FileSizeLimitIsAnError limit;
    write_folder(tmp, model, optimizer, loop, trainer_state_json);
  } catch (const std::exception& e) {
    // Nothing half-written is left (it would hold the space a full disk needs), and the message
    // says what a run can resume from (the newest complete checkpoint, which `tmp` never is); the
    // model and optimizer in memory are untouched.
    std::error_code ec;
    fs::remove_all(tmp, ec);
    const auto* failed = dynamic_cast<const CheckpointError*>(&e);
    const std::string file = failed ? failed->file() : tmp.string();
    std::string what = e.what();
    if (what.rfind(file + ": ", 0) == 0) what = what.substr(file.size() + 2);
    const std::string before = last(output_dir);
    throw CheckpointError(file, what + "; " + name + " was not saved (its partial folder was removed); " +
                                    (before.empty() ? std::string("there is no earlier checkpoint in ") + output_dir
                                                    : "the newest complete checkpoint is " + before) +
                                    ", and the model and optimizer in memory are as training left them");
  }

  // Into place. A folder of that name (a run that reached this step before) is moved aside first,
  // since rename() does not replace a folder that has files.
  std::optional<fs::path> old;
  if (fs::exists(final_dir)) {
    old = out / ("tmp-" + name + "-replaced");
    fs::remove_all(*old);
    fs::rename(final_dir, *old);
  }
  fs::rename(tmp, final_dir);
  sync_path(out);
  if (old) fs::remove_all(*old);
  return final_dir.string();
}

std::vector<std::string> rotate(const std::string& output_dir, int64_t limit, const std::string& keep,
                                const std::string& keep_too) {
  std::vector<std::string> removed;
  if (limit <= 0 || !fs::is_directory(output_dir)) return removed;
  std::vector<std::pair<int64_t, fs::path>> found;
  for (const auto& e : fs::directory_iterator(output_dir)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_directory() && std::regex_match(name, m, checkpoint_re())) found.emplace_back(std::stoll(m[1]), e.path());
  }
  std::sort(found.begin(), found.end());
  for (size_t i = 0; i + static_cast<size_t>(limit) < found.size(); ++i) {
    std::error_code ec;
    if (fs::equivalent(found[i].second, keep)) continue;
    if (!keep_too.empty() && fs::equivalent(found[i].second, keep_too, ec)) continue;
    fs::remove_all(found[i].second);
    removed.push_back(found[i].second.string());
  }
  return removed;
}

namespace {

// Whether a file holds whole JSON (a copy cut short does not).
bool whole_json(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return in && nlohmann::json::accept(text.str());
}

// What a checkpoint folder lacks of the files save writes ("" when it holds them all, none empty),
// and whether its trainer_state.json reads as JSON.
std::string incomplete(const fs::path& dir) {
  std::error_code ec;
  for (const char* f : {kModel, kOptimizer, kScheduler, kRng, kTrainerState, kTrainerStateJson}) {
    const auto size = fs::file_size(dir / f, ec);
    if (ec) return std::string("it has no ") + f;
    if (size == 0) return std::string("its ") + f + " is empty";
  }
  if (!whole_json(dir / kTrainerStateJson))
    return std::string("its ") + kTrainerStateJson + " is not whole JSON (cut short?)";
  return "";
}

// The folders of output_dir whose names `re` matches (its first group the step), by step.
std::vector<std::pair<int64_t, fs::path>> step_folders(const std::string& output_dir, const std::regex& re) {
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> found;
  if (output_dir.empty() || !fs::is_directory(output_dir, ec)) return found;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_directory(ec) && std::regex_match(name, m, re)) found.emplace_back(std::stoll(m[1]), e.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

std::vector<std::string> all(const std::string& output_dir) {
  static const std::regex any_re("(?:tmp-)?checkpoint-([0-9]+)");
  std::vector<std::string> out;
  for (const auto& [step, dir] : step_folders(output_dir, any_re)) out.push_back(dir.string());
  return out;
}

std::string last(const std::string& output_dir) {
  // The newest complete one: a folder that lacks a file (copied in part, or damaged) is passed over,
  // with a warning that says what it lacks.
  const auto found = step_folders(output_dir, checkpoint_re());
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    const fs::path& dir = it->second;
    const std::string why = incomplete(dir);
    if (why.empty()) return dir.string();
    log_warn("kiln::Trainer: checkpoint " + dir.string() + " is passed over as the newest checkpoint: " + why);
  }
  return "";
}

void load_model(const std::string& dir_text, torch::nn::Module& model) {
  const fs::path dir(dir_text);
  std::vector<std::pair<at::Tensor, at::Tensor>> tensors;
  {
    torch::serialize::InputArchive ar;
    open_archive(dir / kModel, ar, device_of(model));
    read_module(model, ar, "", dir / kModel, tensors);
  }
  c10::NoGradGuard no_grad;
  for (auto& [target, value] : tensors) target.copy_(value);
}

LoopState load(const std::string& dir_text, torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  const fs::path dir(dir_text);
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw CheckpointError(dir_text, "no such checkpoint folder");
  if (!fs::is_directory(dir, ec))
    throw CheckpointError(dir_text, "not a folder: a checkpoint is a checkpoint-<step> folder");
  const auto device = device_of(model);

  // 1. Read everything and check it; nothing changes yet.
  std::vector<std::pair<at::Tensor, at::Tensor>> tensors;
  {
    torch::serialize::InputArchive ar;
    open_archive(dir / kModel, ar, device);
    read_module(model, ar, "", dir / kModel, tensors);
  }

  // trainer_state.json is for people and tools, but a copy of it cut short says the folder is damaged.
  if (const auto size = fs::file_size(dir / kTrainerStateJson, ec);
      !ec && size > 0 && !whole_json(dir / kTrainerStateJson))
    throw CheckpointError((dir / kTrainerStateJson).string(),
                          "is not whole JSON (cut short?): the checkpoint folder is damaged");
  LoopState loop;
  {
    const fs::path f = dir / kTrainerState;
    torch::serialize::InputArchive ar;
    open_archive(f, ar, at::kCPU);
    loop.global_step = read_int(ar, f, "global_step");
    loop.epoch = read_int(ar, f, "epoch");
    loop.step_in_epoch = read_int(ar, f, "step_in_epoch");
    loop.epoch_end_pending = read_int(ar, f, "epoch_end_pending") != 0;
    loop.epoch_progress = read_double(ar, f, "epoch_progress");
    loop.total_loss = read_tensor(ar, f, "total_loss", /*required=*/loop.global_step > 0);
    loop.interval_loss = read_tensor(ar, f, "interval_loss", false);
    loop.interval_steps = read_int(ar, f, "interval_steps");
    for (auto [key, list] :
         {std::make_pair("log_history", &loop.log_history), std::make_pair("layouts", &loop.layouts)}) {
      const auto v = read_value(ar, f, key);
      if (!v.isList()) throw CheckpointError(f.string(), "'" + std::string(key) + "' is not a list");
      for (const auto& line : v.toListRef()) {
        if (!line.isString())
          throw CheckpointError(f.string(), "'" + std::string(key) + "' holds something other than text");
        list->push_back(line.toStringRef());
      }
    }
    loop.dataset_size = read_int(ar, f, "dataset_size");
    loop.per_device_train_batch_size = read_int(ar, f, "per_device_train_batch_size");
    loop.gradient_accumulation_steps = read_int(ar, f, "gradient_accumulation_steps");
    loop.seed = read_int(ar, f, "seed");
    if (c10::IValue v; ar.try_read("group_by_length", v)) {
      if (!v.isInt()) throw CheckpointError(f.string(), "'group_by_length' is not an integer");
      loop.group_by_length = v.toInt() != 0;
    }
    // (absent from checkpoints written before they existed: no best yet)
    if (c10::IValue v; ar.try_read("best_metric", v)) {
      if (!v.isDouble()) throw CheckpointError(f.string(), "'best_metric' is not a number");
      loop.best_metric = v.toDouble();
    }
    if (c10::IValue v; ar.try_read("best_model_checkpoint", v)) {
      if (!v.isString()) throw CheckpointError(f.string(), "'best_model_checkpoint' is not text");
      loop.best_model_checkpoint = v.toStringRef();
    }
    if (loop.global_step < 0 || loop.epoch < 0 || loop.step_in_epoch < 0 || loop.interval_steps < 0)
      throw CheckpointError(f.string(), "holds a negative step count");
  }
  {
    const fs::path f = dir / kScheduler;
    torch::serialize::InputArchive ar;
    open_archive(f, ar, at::kCPU);
    loop.schedule.type = read_string(ar, f, "lr_scheduler_type");
    const double first = read_double(ar, f, "learning_rate");
    if (c10::IValue v; ar.try_read("base_lrs", v)) {
      if (!v.isDoubleList()) throw CheckpointError(f.string(), "'base_lrs' is not a list of numbers");
      for (double r : v.toDoubleList()) loop.schedule.peak_lrs.push_back(r);
    } else {
      loop.schedule.peak_lrs = {first};  // written before base_lrs: one rate for every group
    }
    loop.schedule.warmup_steps = read_int(ar, f, "warmup_steps");
    loop.schedule.total_steps = read_int(ar, f, "total_steps");
    if (read_int(ar, f, "last_step") != loop.global_step)
      throw CheckpointError(f.string(), "was written at another step than " + std::string(kTrainerState));
    if (c10::IValue v; ar.try_read("plateau_lrs", v)) {
      if (!v.isDoubleList()) throw CheckpointError(f.string(), "'plateau_lrs' is not a list of numbers");
      for (double r : v.toDoubleList()) loop.schedule.plateau_lrs.push_back(r);
      loop.schedule.plateau_best = read_double(ar, f, "plateau_best");
      loop.schedule.plateau_bad = read_int(ar, f, "plateau_num_bad_epochs");
      loop.schedule.plateau_cooldown = read_int(ar, f, "plateau_cooldown_counter");
    }
    if (c10::IValue v; ar.try_read("loss_scale", v)) {
      loop.schedule.loss_scale = read_double(ar, f, "loss_scale");
      loop.schedule.scale_growth_tracker = read_double(ar, f, "scale_growth_tracker");
      loop.schedule.skipped_steps = read_int(ar, f, "skipped_steps");
      if (!(loop.schedule.loss_scale > 0) || loop.schedule.skipped_steps < 0 ||
          loop.schedule.skipped_steps > loop.global_step || loop.schedule.scale_growth_tracker < 0)
        throw CheckpointError(f.string(),
                              "holds a loss scale that is not positive or a skipped step count outside 0 to " +
                                  std::to_string(loop.global_step));
    }
  }
  {
    const fs::path f = dir / kRng;
    torch::serialize::InputArchive ar;
    open_archive(f, ar, at::kCPU);
    loop.cpu_rng_state = read_tensor(ar, f, "cpu", true);
    loop.data_order_state = read_tensor(ar, f, "data_order", true);
    // Checked on copies of the generators: a state of the wrong size is refused here, not later.
    auto check = [&](at::Generator gen, const at::Tensor& state, const std::string& what) {
      try {
        gen.clone().set_state(state);
      } catch (const std::exception& e) {
        throw CheckpointError(f.string(), "the " + what + " generator's state does not fit: " + short_error(e));
      }
    };
    check(cpu_generator(), loop.cpu_rng_state, "CPU");
    check(cpu_generator(), loop.data_order_state, "data-order");
    const int64_t saved = read_int(ar, f, "cuda/count"), here = cuda_devices();
    for (int64_t i = 0; i < saved; ++i) {
      at::Tensor s = read_tensor(ar, f, "cuda/" + std::to_string(i), true);
      if (i < here) check(cuda_generator(i), s, "CUDA " + std::to_string(i));
      loop.cuda_rng_states.push_back(s);
    }
    if (saved != here)
      log_warn("kiln::Trainer: " + f.string() + " holds the generators of " + std::to_string(saved) +
               " CUDA devices, this machine has " + std::to_string(here) +
               "; the random numbers on the GPUs will not continue as they would have");
  }

  // 2. The optimizer: the only part whose loading can still fail; it puts itself back if it does.
  {
    const fs::path f = dir / kOptimizer;
    torch::serialize::InputArchive ar;
    open_archive(f, ar, device);
    load_optimizer(optimizer, ar, f);
  }

  // 3. The model, in place: the same tensors (compiled plans and CUDA graphs keep reading them).
  {
    c10::NoGradGuard no_grad;
    for (auto& [target, value] : tensors) target.copy_(value);
  }
  return loop;
}

void apply_rng(const LoopState& loop) {
  {
    auto gen = cpu_generator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(loop.cpu_rng_state);
  }
  const int64_t here = cuda_devices();
  for (size_t i = 0; i < loop.cuda_rng_states.size() && static_cast<int64_t>(i) < here; ++i) {
    auto gen = cuda_generator(static_cast<int64_t>(i));
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(loop.cuda_rng_states[i]);
  }
}

}  // namespace kiln::checkpoint
