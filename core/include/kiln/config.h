// kiln's configuration: every setting lives in TrainingArguments — the Hugging Face names at the
// top, kiln's own in [runtime], [debug] and [experimental] — read once from code, a TOML file and
// environment variables (code < file < environment) and passed down explicitly. No LibTorch here.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln {

// The compile modes, with the meanings PyTorch's torch.compile gives them.
const std::vector<std::string>& valid_modes();
// The in-tree backends plus "auto"; third-party names are checked against the loaded plugins.
const std::vector<std::string>& builtin_backends();

// $XDG_CACHE_HOME/kiln, else ~/.cache/kiln, else /tmp/kiln-cache.
std::string default_cache_dir();

// Where a setting came from, so later checks (a backend name against the plugins found) can
// point at the file and line that set it.
struct SettingOrigin {
  std::string source;  // a file path, "environment (KILN_BACKEND)" or "code"
  int line = 0;        // 1-based; 0 when not from a file
  int column = 0;
  std::string describe() const;  // "train.toml:3:1" or "environment (KILN_BACKEND)"
};

// Every configuration error says what was wrong and where.
class ConfigError : public std::runtime_error {
 public:
  ConfigError(SettingOrigin where, std::string key, std::string what);
  const SettingOrigin& where() const { return where_; }
  const std::string& key() const { return key_; }  // the setting's key, e.g. "runtime.fullgraph"

 private:
  SettingOrigin where_;
  std::string key_;
};

struct RuntimeOptions {                         // [runtime]
  std::vector<std::string> plugin_dirs;         // KILN_PLUGIN_PATH (':'-separated, searched before the file's)
  std::string cache_dir = default_cache_dir();  // KILN_CACHE_DIR
  bool fullgraph = false;                       // a step that cannot be captured whole is an error, not an eager run
  int recompile_limit = 8;
  // KILN_DYNAMIC: shapes that change between steps (PyTorch's dynamic=None/True/False). "auto": the
  // first shape compiles static, and the first time a size changes the step is compiled once more
  // with that dimension symbolic; "true": every dimension a second shape changes is symbolic, and
  // dimensions marked in mark_dynamic are symbolic from the first step; "false": one plan per shape.
  // In a file also a boolean.
  std::string dynamic = "auto";
  // Input dimensions that are symbolic from the start (torch._dynamo.mark_dynamic): "input:dim",
  // e.g. "0:1" for the sequence length of the step's first input.
  std::vector<std::string> mark_dynamic;
  // Shapes of a dynamic step whose plans are kept at once (least recently used dropped); kept apart
  // from recompile_limit.
  int dynamic_shape_cache = 64;
  bool cpu_block_cache = true;            // KILN_CPU_CACHE
  int64_t cpu_block_cache_max_mb = 2048;  // KILN_CPU_CACHE_MAX_MB
  bool writeback_copy = false;            // KILN_WRITEBACK_COPY: every write-back copies (no storage adoption)
  bool graph_copies = true;               // KILN_GRAPH_COPIES: a CUDA graph copies the batch in and results out itself
  int compile_threads = 0;                // KILN_COMPILE_THREADS: groups compiled at once; 0 = one per CPU core
  // KILN_ACTIVATION_MEMORY_BUDGET (PyTorch's torch._functorch.config.activation_memory_budget): the
  // share of the forward's activations the step keeps for its backward; what it drops, the backward
  // computes again (element-wise ops, views, casts, layer norm; never matmuls, attention or random
  // ops). 1 keeps everything; 0 recomputes all it can.
  double activation_memory_budget = 1.0;
  // KILN_CHANNELS_LAST: CUDA convolutions on NHWC activations under a backend: "auto" (steps
  // recorded as a CUDA graph), "always" (every CUDA step), "never"
  std::string channels_last = "auto";
};

struct DebugOptions {                 // [debug]
  std::string dump_dir;               // KILN_DEBUG_DIR: IR after every pass, the partition, the plan
  bool check_meta = false;            // KILN_CHECK_META
  bool verify_groups = false;         // KILN_VERIFY_GROUPS
  bool lift_runtime_scalars = false;  // KILN_LIFT_RUNTIME_SCALARS
  bool no_comm_overlap = false;       // KILN_NO_COMM_OVERLAP: all_reduces after the whole backward
};

struct ExperimentalOptions {     // [experimental]
  bool batch_optimizer = false;  // KILN_BATCH_OPTIMIZER
};

struct TrainingArguments {
  bool torch_compile = false;
  std::string torch_compile_backend = "auto";  // KILN_BACKEND
  std::string torch_compile_mode = "default";  // KILN_MODE
  // Trainer: clip the gradients' total 2-norm to this before the optimizer step
  // (torch::nn::utils::clip_grad_norm_). 0 turns clipping off. Hugging Face's default is 1.0;
  // kiln's is 0, so that a Trainer step computes what the plain LibTorch loop it replaces computes.
  double max_grad_norm = 0.0;
  // KILN_LOG_LEVEL: trace, debug, info, warning (or warn), error, critical, off, or passive (leave
  // the level as the program or the environment set it).
  std::string log_level = "info";
  // Mixed precision, with Hugging Face's names. bf16: the Trainer runs the forward and the loss
  // under bfloat16 autocast on the model's device, inside the compiled step (parameters, gradients
  // and the optimizer stay float32). fp16 needs dynamic loss scaling, which kiln does not compile
  // yet: the Trainer refuses it, naming bf16. tf32: TF32 matmuls and convolutions on GPUs that have
  // them (LibTorch's allow_tf32 switches); false leaves LibTorch's defaults.
  bool bf16 = false;
  bool fp16 = false;
  bool tf32 = false;
  // The optimizer a Trainer made without one gets (Hugging Face's): optim is adamw_torch (or
  // adamw_torch_fused, the same here), adam, sgd, adagrad or rmsprop, at learning_rate (5e-5 when
  // unset), with weight_decay on every parameter but biases and normalisation layers' weights;
  // adam_beta1, adam_beta2 and adam_epsilon for the Adam kinds. A Trainer given an optimizer does
  // not use them (its log names those set).
  std::string optim = "adamw_torch";
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  // Trainer::train, with Hugging Face's names, defaults and meanings (docs/config.md).
  std::string output_dir;                   // the metrics file goes here; "" writes none
  double num_train_epochs = 3.0;            // may be fractional
  int64_t max_steps = -1;                   // > 0: the number of optimizer steps; wins over num_train_epochs
  int64_t per_device_train_batch_size = 8;  // examples per micro-batch
  int64_t gradient_accumulation_steps = 1;  // micro-batches per optimizer step
  // The schedule's peak for every parameter group in train(). Unset (the default): each group's own
  // lr, as the optimizer has it, is its peak, as Hugging Face's Trainer schedules an optimizer it is
  // given. Set, it wins over the optimizer's rates (a log line of train() says which holds).
  std::optional<double> learning_rate;
  // Hugging Face's schedules: constant, constant_with_warmup, linear, cosine, cosine_with_restarts,
  // polynomial, inverse_sqrt, cosine_with_min_lr, warmup_stable_decay; their arguments (num_cycles,
  // lr_end, power, timescale, min_lr, min_lr_rate, num_stable_steps, num_decay_steps, min_lr_ratio,
  // decay_type) in lr_scheduler_kwargs, as text (docs/config.md).
  std::string lr_scheduler_type = "linear";
  std::map<std::string, std::string> lr_scheduler_kwargs;
  int64_t warmup_steps = 0;          // > 0 wins over warmup_ratio
  double warmup_ratio = 0.0;         // of the total optimizer steps
  double logging_steps = 500;        // a metrics line every this many optimizer steps; below 1: a ratio of the total
  bool logging_first_step = false;   // a metrics line after the first optimizer step too
  int64_t seed = 42;                 // torch::manual_seed at the start of train(), and the shuffling
  std::optional<int64_t> data_seed;  // the shuffling's seed when set (Hugging Face's); unset: seed
  // The run's name, in trainer_state.json and the first log line of train(); "" is output_dir.
  std::string run_name;
  bool dataloader_drop_last = false;  // drop each epoch's last micro-batch when it is short
  // Checkpoints: <output_dir>/checkpoint-<global_step>/ (the model, the optimizer, the schedule, the
  // random generators, the position in the data; trainer_state.json), written atomically.
  std::string save_strategy = "steps";  // no, steps (every save_steps, and at the end), epoch
  double save_steps = 500;              // below 1: a ratio of the total optimizer steps
  int64_t save_total_limit = 0;         // > 0: keep this many checkpoints, deleting the oldest; 0 keeps all
  // A checkpoint folder to continue from, or "true"/"last": the newest checkpoint-<step> in
  // output_dir. "" starts afresh. A TOML boolean works too (true is "true", false is "").
  std::string resume_from_checkpoint;
  // A run that does not resume, into an output_dir that holds checkpoint-<step> folders (another
  // run's), stops with an error unless this is true; then those folders are deleted first, so that
  // "last" can only ever resume this run.
  bool overwrite_output_dir = false;
  // The best model (Hugging Face's): metric_for_best_model names an evaluation metric ("loss" or
  // "eval_loss", "accuracy"...; "" is "loss" when load_best_model_at_end); greater_is_better says
  // which way is better (unset: false for the loss, true otherwise). Trainer::state() keeps the
  // best value and the checkpoint saved with it; load_best_model_at_end loads that checkpoint's
  // model when train() ends (it needs save_strategy = eval_strategy, and save_steps a multiple of
  // eval_steps).
  bool load_best_model_at_end = false;
  std::string metric_for_best_model;
  std::optional<bool> greater_is_better;
  // Evaluation on the dataset given to train(train, eval) or evaluate(): no, steps, epoch.
  std::string eval_strategy = "no";
  double eval_steps = 0;                   // 0: logging_steps (Hugging Face's default); below 1: a ratio
  int64_t per_device_eval_batch_size = 8;  // examples per evaluation batch
  // Where the metrics go: "all" (every integration kiln has), "jsonl" (<output_dir>/metrics.jsonl)
  // or "none". A TOML string or array of strings.
  std::vector<std::string> report_to = {"all"};
  // No progress bar on a terminal: plain log lines every logging_steps instead, as when stderr is
  // not a terminal.
  bool disable_tqdm = false;
  // Variable-length examples (kiln/data.h): each epoch's order groups examples of similar length
  // into the same batches (Hugging Face's LengthGroupedSampler), so they need little padding.
  bool group_by_length = false;
  // DataCollatorWithPadding rounds a batch's padded length up to a multiple of this (fewer distinct
  // shapes to compile); 0 pads to the longest example only.
  int64_t pad_to_multiple_of = 0;
  // Data-parallel training (docs/distributed.md), when the process runs under torchrun (WORLD_SIZE
  // > 1) or is handed a process group: gradients averaged across the ranks inside the step.
  std::string ddp_backend;                  // "gloo" or "nccl"; "" picks nccl for CUDA models, else gloo
  int64_t ddp_bucket_cap_mb = 25;           // gradients all-reduced in buckets of this many MiB
  bool ddp_find_unused_parameters = false;  // parameters without a gradient count as zero (else an error)
  int64_t ddp_timeout = 1800;               // seconds a collective or the rendezvous may wait for a rank
  // [plugin.<name>] tables: free-form key/value options handed to that plugin as strings.
  // KILN_PLUGIN_OPTIONS="<name>.<option>=<value>,..." overrides single options.
  std::map<std::string, std::map<std::string, std::string>> plugin_options;

  RuntimeOptions runtime;
  DebugOptions debug;
  ExperimentalOptions experimental;

  // Settings made by a file or the environment, by key ("runtime.fullgraph",
  // "plugin.inductor.cxx"), with where they came from; a key not here was set in code or defaulted.
  std::map<std::string, SettingOrigin> origins;

  // Defaults, then the file, then the environment. Throws ConfigError.
  static TrainingArguments from_toml(const std::string& path);
  // Same, from TOML text; `source_name` is used in error messages.
  static TrainingArguments from_toml_string(const std::string& text, const std::string& source_name = "<string>");

  // Layers a file over these settings (code < file).
  void apply_toml(const std::string& path);
  void apply_toml_string(const std::string& text, const std::string& source_name);
  // Layers every environment variable of settings() on top. Applying it twice changes nothing
  // more than applying it once. Throws ConfigError naming the variable and its value.
  void apply_env();
  // Checks every value, set in code too (mode name, limits); throws ConfigError.
  void validate() const;
  // Checks the backend name against the plugins actually found ("auto" always passes). `refused`:
  // plugin files the loader refused, by the name their file gives them, each with "<path>: <why>";
  // naming one of them says that instead of "unknown backend".
  void validate_backend(const std::vector<std::string>& available,
                        const std::map<std::string, std::string>& refused = {}) const;

  // Hugging Face semantics: naming a backend or a mode turns torch_compile on.
  bool compile_enabled() const;

  static std::string default_cache_dir() { return kiln::default_cache_dir(); }
};

// One setting as docs/config.md lists it. The key is both the TOML path and the field's path in
// TrainingArguments ("runtime.fullgraph" is `[runtime] fullgraph` and `args.runtime.fullgraph`).
struct SettingInfo {
  std::string key;           // "torch_compile", "runtime.fullgraph", "plugin.<name>.<option>"
  std::string env;           // the variable that overrides it; empty when there is none
  std::string default_text;  // as TOML writes it: "false", "8", "\"auto\"", "[]"; empty for plugin options
};
// Every setting, in the order docs/config.md lists them. The same table parses files and the
// environment and checks values, so a key is named in one place.
std::vector<SettingInfo> settings();

// The kiln logger's level before any TrainingArguments is read: KILN_LOG_LEVEL when it names a
// level, else "info". A bad value is reported when the arguments are read (apply_env).
std::string initial_log_level();

// Levenshtein-nearest candidate within a small distance, for "did you mean".
std::optional<std::string> nearest_name(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace kiln
