/* kiln plugin ABI, version 2.5: the whole contract between the kiln host and a backend plugin.
 *
 * A plugin is a shared library that exports exactly one symbol, kiln_plugin_init. Through it the
 * host and the plugin exchange two function tables: KilnHostApi (services the host offers: logging,
 * device memory, the cache directory, plugin options, eager ATen calls) and KilnPluginApi (what the
 * plugin does: describe itself, say whether it can run here, claim graph nodes, compile them, run
 * them, record device graphs). Everything that crosses is plain C: no C++ types, no exceptions, no
 * LibTorch.
 *
 * Rules that keep old plugins working with new hosts and the reverse (docs/abi.md has the why):
 *  - ABI major must match; minor is negotiated down to the smaller of the two sides.
 *  - Every function of either table takes one argument struct, Kiln<Object><Verb>Args, whose first
 *    field is `size_t struct_size`: a later minor adds a field to it, never a new function. The
 *    caller sets struct_size to KILN_<OBJECT>_<VERB>_ARGS_STRUCT_SIZE; fields marked `out` are
 *    written by the callee. The only exceptions are frozen forever so that any kiln can talk to
 *    any plugin far enough to refuse it: kiln_plugin_init's signature and the first six fields of
 *    both tables (struct_size, abi_major, abi_minor and the three error functions).
 *  - Every struct begins with `size_t struct_size`, which its writer sets to KILN_<NAME>_STRUCT_SIZE
 *    (computed from the struct's last field). Fields are only ever added at the end. A reader that
 *    knows a newer layout checks KILN_HAS_FIELD before reading a field the writer may not have had.
 *  - Arrays of structs are passed as arrays of pointers, so a struct can grow without changing the
 *    stride a reader uses.
 *  - A NULL optional function means "not implemented"; it is never called.
 *  - Errors are values: a function returns NULL on success or a KilnError* that the receiver owns
 *    and frees through the error_destroy of the side that made it (the table it came from).
 *  - Strings are UTF-8 and NUL-terminated. Every pointer says whose it is and how long it lives;
 *    "borrowed" means valid only until the call it is passed to returns.
 *
 * Changes are listed in plugin_api/CHANGELOG.md. This header compiles as C99 and as C++. */
#ifndef KILN_PLUGIN_API_H_
#define KILN_PLUGIN_API_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_ABI_VERSION_MAJOR 2
#define KILN_ABI_VERSION_MINOR 5

/* The one exported symbol. */
#define KILN_PLUGIN_INIT_SYMBOL "kiln_plugin_init"

#if defined(_WIN32)
#define KILN_PLUGIN_EXPORT __declspec(dllexport)
#else
#define KILN_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* Size of a struct up to and including `last_field`: what a writer puts in struct_size. */
#define KILN_STRUCT_SIZE(type, last_field) (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

/* Whether the struct behind `ptr` (which says its own struct_size) is new enough to have `field`. */
#define KILN_HAS_FIELD(ptr, type, field) ((ptr)->struct_size >= offsetof(type, field) + sizeof(((type*)0)->field))

/* Compile-time checks that work in C99 (no _Static_assert there) and in C++. */
#if defined(__cplusplus)
#define KILN_STATIC_ASSERT(cond, name) static_assert(cond, #name)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define KILN_STATIC_ASSERT(cond, name) _Static_assert(cond, #name)
#else
#define KILN_STATIC_ASSERT(cond, name) typedef char kiln_static_assert_##name[(cond) ? 1 : -1]
#endif

/* Declares KILN_<NAME>_STRUCT_SIZE and checks that `last_field` really is the last field: a field
 * added after it without updating the macro makes sizeof exceed the macro by at least 8 bytes, as
 * every field that may be added is 8 bytes wide or packed into an 8-byte group (docs/abi.md). */
#define KILN_CHECK_STRUCT_SIZE(type, size_macro) \
  KILN_STATIC_ASSERT(sizeof(type) >= (size_macro) && sizeof(type) - (size_macro) < 8, type##_last_field_is_last)

/* ---- Errors ---------------------------------------------------------------------------------- */

/* Opaque. Made by either side; the receiver owns it and frees it with error_destroy from the table
 * of the side that made it (KilnPluginApi for errors a plugin returns, KilnHostApi for errors a
 * host service returns). */
typedef struct KilnError KilnError;

typedef int32_t KilnErrorCode;
enum {
  KILN_ERROR_UNKNOWN = 1,
  KILN_ERROR_INVALID_ARGUMENT = 2, /* bad graph, bad option value, bad tensors */
  KILN_ERROR_UNIMPLEMENTED = 3,    /* from compile: "run these nodes eagerly"; never fatal */
  KILN_ERROR_UNAVAILABLE = 4,      /* a device or runtime this needs is not there */
  KILN_ERROR_OUT_OF_MEMORY = 5,
  KILN_ERROR_INTERNAL = 6,    /* a bug in whoever returned it */
  KILN_ERROR_ABI_MISMATCH = 7 /* the other side speaks an ABI this side cannot */
};

/* ---- Enumerations (fixed-width values, never C enums in structs) ----------------------------- */

typedef int32_t KilnDeviceKind;
enum {
  KILN_DEVICE_CPU = 0,
  KILN_DEVICE_CUDA = 1,
  KILN_DEVICE_GAUDI = 2, /* Intel Gaudi (HPU) */
  KILN_DEVICE_NEURON = 3 /* AWS Trainium / Inferentia */
};
#define KILN_DEVICE_KIND_BIT(kind) (1u << (uint32_t)(kind))
#define KILN_DEVICE_MASK_CPU KILN_DEVICE_KIND_BIT(KILN_DEVICE_CPU)
#define KILN_DEVICE_MASK_CUDA KILN_DEVICE_KIND_BIT(KILN_DEVICE_CUDA)
#define KILN_DEVICE_MASK_GAUDI KILN_DEVICE_KIND_BIT(KILN_DEVICE_GAUDI)
#define KILN_DEVICE_MASK_NEURON KILN_DEVICE_KIND_BIT(KILN_DEVICE_NEURON)

/* The torch.compile modes, with PyTorch's meanings. */
typedef int32_t KilnMode;
enum {
  KILN_MODE_DEFAULT = 0,
  KILN_MODE_REDUCE_OVERHEAD = 1,
  KILN_MODE_MAX_AUTOTUNE = 2,
  KILN_MODE_MAX_AUTOTUNE_NO_CUDAGRAPHS = 3
};
#define KILN_MODE_BIT(mode) (1u << (uint32_t)(mode))
#define KILN_MODE_MASK_ALL 0xFu

/* CPU instruction set features that the CPU has AND the OS has enabled (XCR0 checked). */
#define KILN_CPU_ISA_AVX2 (1ull << 0)
#define KILN_CPU_ISA_AVX512F (1ull << 1)
#define KILN_CPU_ISA_AVX512_BF16 (1ull << 2)
#define KILN_CPU_ISA_AMX_BF16 (1ull << 3)
#define KILN_CPU_ISA_AMX_INT8 (1ull << 4)
#define KILN_CPU_ISA_FMA (1ull << 5)
#define KILN_CPU_ISA_AVX512_VNNI (1ull << 6)
#define KILN_CPU_ISA_AMX_TILE (1ull << 7)

typedef int32_t KilnLogLevel; /* same order as spdlog and kiln::LogLevel */
enum {
  KILN_LOG_TRACE = 0,
  KILN_LOG_DEBUG = 1,
  KILN_LOG_INFO = 2,
  KILN_LOG_WARN = 3,
  KILN_LOG_ERROR = 4,
  KILN_LOG_CRITICAL = 5
};

/* DLPack 0.8+ type code for bool (DLPack 0.6 lacks it); ATen describes bool tensors with it. */
#define KILN_DL_BOOL 6

/* Layout and memory format arguments carry c10's numbering. */
enum { KILN_LAYOUT_STRIDED = 0 };
enum {
  KILN_MEMORY_FORMAT_CONTIGUOUS = 0,
  KILN_MEMORY_FORMAT_PRESERVE = 1,
  KILN_MEMORY_FORMAT_CHANNELS_LAST = 2,
  KILN_MEMORY_FORMAT_CHANNELS_LAST_3D = 3
};

/* ---- Devices --------------------------------------------------------------------------------- */

/* One device found by kiln's hardware probe, as handed to KilnPluginApi.available. Every string is
 * borrowed for the call and never NULL ("" when unknown); numbers are 0 when unknown or not
 * meaningful for the kind. */
typedef struct KilnDeviceInfo {
  size_t struct_size;
  KilnDeviceKind kind;    /* KILN_DEVICE_* */
  int32_t index;          /* ordinal among devices of this kind: CUDA ordinal, Gaudi accel
                             index, Neuron device index; CPU: socket, 0 for the first */
  const char* name;       /* product name: "NVIDIA H200", "Intel(R) Xeon(R) Platinum 8480+",
                             "Gaudi2", "Trainium2" */
  const char* vendor;     /* CPU: the CPUID vendor string ("GenuineIntel", "AuthenticAMD");
                             others: "NVIDIA", "Habana", "AWS" */
  const char* pci_bus_id; /* "0000:3b:00.0"; "" for the CPU */
  uint32_t pci_vendor_id; /* 0x10de NVIDIA, 0x1da3 Habana, 0x1d0f AWS; 0 for the CPU */
  uint32_t pci_device_id;
  int32_t compute_capability_major; /* CUDA only, e.g. 9 for sm_90 */
  int32_t compute_capability_minor;
  uint64_t total_memory_bytes;  /* device memory; CPU: installed system memory */
  int32_t multiprocessor_count; /* CUDA: SMs; CPU: logical processors; others: cores if known */
  uint32_t reserved0;           /* 0; keeps cpu_isa 8-byte aligned */
  uint64_t cpu_isa;             /* CPU only: KILN_CPU_ISA_* bits usable here (CPU and OS agree) */
} KilnDeviceInfo;
#define KILN_DEVICE_INFO_STRUCT_SIZE KILN_STRUCT_SIZE(KilnDeviceInfo, cpu_isa)
KILN_CHECK_STRUCT_SIZE(KilnDeviceInfo, KILN_DEVICE_INFO_STRUCT_SIZE);

/* ---- Graph view ------------------------------------------------------------------------------ */
/* A read-only view of a pure (functionalized) graph of ATen ops, built by the host. All of it is
 * borrowed: valid only during the call it is passed to; a plugin that needs it later copies it.
 * Values are referred to by their index in KilnGraphView.values ("value index"). */

/* A tensor value. */
typedef struct KilnValue {
  size_t struct_size;
  int64_t id;       /* the host's own id for this value, for messages and dumps */
  DLDataType dtype; /* DLPack type; bool is {KILN_DL_BOOL, 8, 1} */
  int32_t ndim;
  DLDevice device;
  const int64_t* shape;   /* ndim sizes; may be NULL when ndim == 0 */
  const int64_t* strides; /* ndim strides in elements; NULL means contiguous row-major */
  int64_t storage_offset; /* in elements, from the start of its storage; 0 if unknown */
} KilnValue;
#define KILN_VALUE_STRUCT_SIZE KILN_STRUCT_SIZE(KilnValue, storage_offset)
KILN_CHECK_STRUCT_SIZE(KilnValue, KILN_VALUE_STRUCT_SIZE);

typedef int32_t KilnArgTag;
enum {
  KILN_ARG_NONE = 0,          /* an omitted optional: None */
  KILN_ARG_TENSOR = 1,        /* graph view: i = value index; call_eager: tensor */
  KILN_ARG_TENSOR_LIST = 2,   /* graph view: ints[len] value indices, -1 for a None element of a
                                 Tensor?[]; call_eager: tensors[len], NULL for None */
  KILN_ARG_BOOL = 3,          /* i = 0 or 1 */
  KILN_ARG_INT = 4,           /* i; also an integral Scalar */
  KILN_ARG_DOUBLE = 5,        /* d; also a floating Scalar */
  KILN_ARG_INT_LIST = 6,      /* ints[len]; also SymInt[] */
  KILN_ARG_DOUBLE_LIST = 7,   /* doubles[len] */
  KILN_ARG_BOOL_LIST = 8,     /* ints[len], each 0 or 1 */
  KILN_ARG_STRING = 9,        /* s */
  KILN_ARG_SCALAR_TYPE = 10,  /* dtype */
  KILN_ARG_DEVICE = 11,       /* device */
  KILN_ARG_LAYOUT = 12,       /* i = KILN_LAYOUT_* */
  KILN_ARG_MEMORY_FORMAT = 13 /* i = KILN_MEMORY_FORMAT_* */
};

/* One argument of an ATen call, tagged. Fields not used by the tag are zero. */
typedef struct KilnArg {
  size_t struct_size;
  KilnArgTag tag;                 /* KILN_ARG_* */
  DLDataType dtype;               /* SCALAR_TYPE */
  const char* name;               /* the schema's argument name ("alpha"); never NULL */
  int64_t i;                      /* TENSOR (value index), BOOL, INT, LAYOUT, MEMORY_FORMAT */
  double d;                       /* DOUBLE */
  const char* s;                  /* STRING */
  size_t len;                     /* element count of any *_LIST */
  const int64_t* ints;            /* INT_LIST, BOOL_LIST, TENSOR_LIST (value indices) */
  const double* doubles;          /* DOUBLE_LIST */
  DLDevice device;                /* DEVICE */
  const DLTensor* tensor;         /* call_eager only: TENSOR */
  const DLTensor* const* tensors; /* call_eager only: TENSOR_LIST */
  /* -1, or: this BOOL/INT/DOUBLE is run-time scalar number `runtime_scalar` of the step (graph
   * views only). Its i/d hold the value seen at capture; the value changes from call to call
   * (Adam's bias corrections do), and KilnExecutableExecuteArgs.scalars carries the current one.
   * A host hands such nodes only to plugins with KILN_CAPABILITY_RUNTIME_SCALARS. */
  int32_t runtime_scalar;
  int32_t reserved0; /* 0 */
} KilnArg;
#define KILN_ARG_STRUCT_SIZE KILN_STRUCT_SIZE(KilnArg, reserved0)
KILN_CHECK_STRUCT_SIZE(KilnArg, KILN_ARG_STRUCT_SIZE);

/* One ATen call. */
typedef struct KilnNode {
  size_t struct_size;
  int64_t id;           /* the host's own id for this node, for messages and dumps */
  const char* op;       /* qualified name with overload: "aten::add.Tensor", "aten::relu"
                           (the default overload has no suffix) */
  const char* name;     /* the schema name alone: "aten::add" */
  const char* overload; /* the overload alone: "Tensor"; "" for the default */
  size_t num_args;
  const KilnArg* const* args; /* EVERY argument of the schema, in schema order, defaults filled */
  size_t num_inputs;
  const int64_t* inputs; /* value indices of the tensor arguments, in argument order (a
                            TENSOR_LIST's elements in place, None elements skipped) */
  size_t num_outputs;
  const int64_t* outputs; /* value indices of the results, in the schema's return order (a
                             Tensor[] return contributes its elements in place) */
} KilnNode;
#define KILN_NODE_STRUCT_SIZE KILN_STRUCT_SIZE(KilnNode, outputs)
KILN_CHECK_STRUCT_SIZE(KilnNode, KILN_NODE_STRUCT_SIZE);

/* Since 2.4 (KILN_CAPABILITY_SYMBOLIC_SHAPES): a size symbol of a symbolic graph view is one
 * dimension of one of its inputs. Fixed layout, no struct_size: arrays of it cross the ABI, and it
 * never grows (a later minor would add another struct). 8 bytes. */
typedef struct KilnSizeSymbol {
  int32_t input; /* index into KilnGraphView.inputs (not a value index) */
  int32_t dim;   /* dimension of that input; its size is the symbol's value, always >= 2 */
} KilnSizeSymbol;
KILN_STATIC_ASSERT(sizeof(KilnSizeSymbol) == 8, KilnSizeSymbol_is_frozen);

/* Where in a graph view a size-derived number sits (KilnSizeSite.kind). */
typedef int32_t KilnSizeSiteKind;
enum {
  KILN_SIZE_SITE_SHAPE = 0,  /* values[at]->shape[elem] */
  KILN_SIZE_SITE_STRIDE = 1, /* values[at]->strides[elem] (the view then has explicit strides) */
  KILN_SIZE_SITE_OFFSET = 2, /* values[at]->storage_offset */
  KILN_SIZE_SITE_INT = 3,    /* nodes[at]->args[arg]->i (an INT) */
  KILN_SIZE_SITE_INTS = 4,   /* nodes[at]->args[arg]->ints[elem] (an INT_LIST) */
  KILN_SIZE_SITE_DOUBLE = 5  /* nodes[at]->args[arg]->d (a DOUBLE: a mean's 1/n) */
};

/* Since 2.4: one number of a symbolic graph view that follows the sizes, and the expression it
 * follows: num * (the product of the factors' symbols) / den + constant, where den > 0 divides the
 * product exactly at every size the host hands the executable; with `reciprocal` (DOUBLE sites
 * only) the number is 1 over that. The number written in the view is the expression at the
 * view's own sizes. Fixed layout, no struct_size, like KilnSizeSymbol. 56 bytes. */
typedef struct KilnSizeSite {
  KilnSizeSiteKind kind; /* KILN_SIZE_SITE_* */
  int32_t at;            /* value index (SHAPE, STRIDE, OFFSET) or node index (INT, INTS, DOUBLE) */
  int32_t arg;           /* argument index (INT, INTS, DOUBLE); -1 otherwise */
  int32_t elem;          /* dimension (SHAPE, STRIDE) or list element (INTS); -1 otherwise */
  int32_t num_factors;   /* 0, 1 or 2 */
  int32_t factors[2];    /* symbol indices (into KilnGraphView.symbols); unused entries -1 */
  int32_t reciprocal;    /* 0 or 1 */
  int64_t num, den, constant;
} KilnSizeSite;
KILN_STATIC_ASSERT(sizeof(KilnSizeSite) == 56, KilnSizeSite_is_frozen);

typedef struct KilnGraphView {
  size_t struct_size;
  size_t num_values;
  const KilnValue* const* values;
  size_t num_nodes;
  const KilnNode* const* nodes; /* in a topological order */
  size_t num_inputs;
  const int64_t* inputs; /* value indices, in the order execute() receives its inputs */
  size_t num_outputs;
  const int64_t* outputs; /* value indices, in the order execute() writes its outputs */
  /* 2.4, symbolic shapes. Read them only when KILN_HAS_FIELD(view, KilnGraphView, size_sites)
   * holds. A host hands a view with symbols only to the compile of a plugin with
   * KILN_CAPABILITY_SYMBOLIC_SHAPES (every other view, and every claim, has none). Such a view is
   * the graph at its own sizes, plus what changes with them: each symbol is an input dimension, and
   * every number the sizes determine (shapes, strides, view sizes, a mean's 1/n) is listed once in
   * size_sites; every number not listed is the same at all sizes. The plugin may accept it for all
   * sizes (KilnPluginCompileArgs.symbolic_accepted); then the host executes that executable at other
   * sizes, passing inputs and outputs of those sizes and the symbols' values. */
  size_t num_symbols;
  const KilnSizeSymbol* symbols;
  size_t num_size_sites;
  const KilnSizeSite* size_sites;
} KilnGraphView;
#define KILN_GRAPH_VIEW_STRUCT_SIZE KILN_STRUCT_SIZE(KilnGraphView, size_sites)
KILN_CHECK_STRUCT_SIZE(KilnGraphView, KILN_GRAPH_VIEW_STRUCT_SIZE);

/* ---- Plugin descriptor ----------------------------------------------------------------------- */

/* What a backend can do, as bits of KilnPluginDescriptor.capabilities. The host reads them instead
 * of knowing plugins by name. Unknown bits are ignored (a later minor may define more). */
#define KILN_CAPABILITY_CONCURRENT_EXECUTE               \
  (1ull << 0) /* execute may run from several threads at \
                 once, on the same or distinct executables */
#define KILN_CAPABILITY_RUNTIME_SCALARS                       \
  (1ull << 1) /* claims nodes with run-time scalars and reads \
                  their values from each execute's args */
#define KILN_CAPABILITY_DEVICE_GRAPHS                       \
  (1ull << 2) /* records and replays device graphs: sets    \
                  graph_capture_begin/end, graph_launch and \
                  graph_destroy */
#define KILN_CAPABILITY_WHOLE_STEP_GRAPH                       \
  (1ull << 3) /* selecting this backend asks for the whole     \
                  step to be recorded as one device graph, in  \
                  every mode (not only reduce-overhead and     \
                  max-autotune); with DEVICE_GRAPHS it records \
                  it itself */
#define KILN_CAPABILITY_CONCURRENT_COMPILE                     \
  (1ull << 4) /* since 2.1: compile may run from several       \
                  threads at once for one context, on distinct \
                  subgraphs (kiln then compiles a step's       \
                  groups in parallel) */
#define KILN_CAPABILITY_GRAPH_COPIES                           \
  (1ull << 5) /* since 2.3, with DEVICE_GRAPHS: graph_capture_ \
                  end takes the copies the host recorded and   \
                  graph_launch re-points them (KilnGraphCopy)  */
#define KILN_CAPABILITY_SYMBOLIC_SHAPES                        \
  (1ull << 6) /* since 2.4: compile may be handed a view with  \
                  size symbols (KilnGraphView.symbols) and may \
                  accept it for every size; such executables   \
                  get each call's sizes (symbol_values) */

/* Owned by the plugin; lives until its shutdown returns. */
typedef struct KilnPluginDescriptor {
  size_t struct_size;
  const char* name;        /* required: [a-z0-9_]+, the name users select ("inductor") and the
                              key of its [plugin.<name>] option table */
  const char* version;     /* required: the plugin's own version, "0.1.0" */
  const char* vendor;      /* required: who made it */
  const char* description; /* optional (NULL): one line for `kiln plugins` */
  uint32_t device_kinds;   /* KILN_DEVICE_MASK_* bits it can compile for; nonzero */
  uint32_t modes;          /* KILN_MODE_BIT(KILN_MODE_*) bits it supports; includes default */
  uint64_t capabilities;   /* KILN_CAPABILITY_* bits */
  int32_t default_score;   /* the availability score when `available` is NULL (see
                              KilnPluginAvailableArgs.score); 0 = only when named */
  uint32_t reserved0;      /* 0 */
} KilnPluginDescriptor;
#define KILN_PLUGIN_DESCRIPTOR_STRUCT_SIZE KILN_STRUCT_SIZE(KilnPluginDescriptor, reserved0)
KILN_CHECK_STRUCT_SIZE(KilnPluginDescriptor, KILN_PLUGIN_DESCRIPTOR_STRUCT_SIZE);

/* ---- Compile and execute types --------------------------------------------------------------- */

/* Opaque, made by compile and owned by the host, which frees it with executable_destroy. */
typedef struct KilnExecutable KilnExecutable;

/* Opaque: an instantiated device graph (a cudaGraphExec_t on CUDA), made by graph_capture_end and
 * owned by the host, which frees it with graph_destroy. */
typedef struct KilnGraphExec KilnGraphExec;

/* One `key = value` of the plugin's [plugin.<name>] table, as strings. */
typedef struct KilnOption {
  size_t struct_size;
  const char* key;
  const char* value;
} KilnOption;
#define KILN_OPTION_STRUCT_SIZE KILN_STRUCT_SIZE(KilnOption, value)
KILN_CHECK_STRUCT_SIZE(KilnOption, KILN_OPTION_STRUCT_SIZE);

/* ---- Host services (the host's table, handed to kiln_plugin_init) ---------------------------- */
/* Every host function is thread-safe and may be called from any thread, also inside execute.
 * host_ctx is KilnHostApi.host_ctx. All pointers in the args are borrowed unless a field says
 * otherwise. */

typedef struct KilnHostLogArgs {
  size_t struct_size;
  void* host_ctx;
  KilnLogLevel level;
  int32_t reserved0;  /* 0 */
  const char* plugin; /* the descriptor name: routes to the host's logger "kiln.<plugin>" */
  const char* message;
} KilnHostLogArgs;
#define KILN_HOST_LOG_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnHostLogArgs, message)
KILN_CHECK_STRUCT_SIZE(KilnHostLogArgs, KILN_HOST_LOG_ARGS_STRUCT_SIZE);

/* Memory on `device` from LibTorch's allocator (CUDA: the caching allocator, ordered on `stream`). */
typedef struct KilnHostDeviceAllocArgs {
  size_t struct_size;
  void* host_ctx;
  DLDevice device;
  size_t nbytes;
  void* stream; /* NULL: the current stream */
  void* ptr;    /* out: owned by the plugin until device_free */
} KilnHostDeviceAllocArgs;
#define KILN_HOST_DEVICE_ALLOC_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnHostDeviceAllocArgs, ptr)
KILN_CHECK_STRUCT_SIZE(KilnHostDeviceAllocArgs, KILN_HOST_DEVICE_ALLOC_ARGS_STRUCT_SIZE);

typedef struct KilnHostDeviceFreeArgs {
  size_t struct_size;
  void* host_ctx;
  DLDevice device;
  void* ptr; /* from device_alloc on `device`; NULL does nothing */
} KilnHostDeviceFreeArgs;
#define KILN_HOST_DEVICE_FREE_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnHostDeviceFreeArgs, ptr)
KILN_CHECK_STRUCT_SIZE(KilnHostDeviceFreeArgs, KILN_HOST_DEVICE_FREE_ARGS_STRUCT_SIZE);

typedef struct KilnHostCacheDirArgs {
  size_t struct_size;
  void* host_ctx;
  const char* cache_dir; /* out: the compile cache directory, never NULL; host-owned, lives
                            until the plugin's shutdown returns */
} KilnHostCacheDirArgs;
#define KILN_HOST_CACHE_DIR_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnHostCacheDirArgs, cache_dir)
KILN_CHECK_STRUCT_SIZE(KilnHostCacheDirArgs, KILN_HOST_CACHE_DIR_ARGS_STRUCT_SIZE);

typedef struct KilnHostGetOptionArgs {
  size_t struct_size;
  void* host_ctx;
  const char* plugin; /* the descriptor name: reads [plugin.<plugin>] */
  const char* key;
  const char* value; /* out: the value, or NULL when unset; host-owned, lives until the
                        plugin's shutdown returns */
} KilnHostGetOptionArgs;
#define KILN_HOST_GET_OPTION_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnHostGetOptionArgs, value)
KILN_CHECK_STRUCT_SIZE(KilnHostGetOptionArgs, KILN_HOST_GET_OPTION_ARGS_STRUCT_SIZE);

/* Runs ATen op `op` ("aten::mm", "aten::add.Tensor") eagerly through the dispatcher. */
typedef struct KilnHostCallEagerArgs {
  size_t struct_size;
  void* host_ctx;
  const char* op;
  const KilnArg* const* args; /* EVERY schema argument in order, tensors as KILN_ARG_TENSOR(_LIST)
                                 with `tensor(s)` set (wrapped, not copied) */
  size_t num_args;
  DLTensor* outputs; /* the results are copied into these, allocated by the caller with
                        the results' shapes and dtypes, in the schema's return order */
  size_t num_outputs;
} KilnHostCallEagerArgs;
#define KILN_HOST_CALL_EAGER_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnHostCallEagerArgs, num_outputs)
KILN_CHECK_STRUCT_SIZE(KilnHostCallEagerArgs, KILN_HOST_CALL_EAGER_ARGS_STRUCT_SIZE);

/* Host-owned; lives until the plugin's shutdown returns. */
typedef struct KilnHostApi {
  /* The first six fields keep their place and signatures in every ABI major. */
  size_t struct_size;
  uint32_t abi_major; /* the host's ABI version */
  uint32_t abi_minor;
  /* Errors the host returns to the plugin (from call_eager, device_alloc). */
  KilnErrorCode (*error_code)(const KilnError* error);
  const char* (*error_message)(const KilnError* error); /* lives as long as `error` */
  void (*error_destroy)(KilnError* error);

  void* host_ctx;                                            /* opaque; goes into every args struct below */
  void (*log)(KilnHostLogArgs* args);                        /* required */
  KilnError* (*device_alloc)(KilnHostDeviceAllocArgs* args); /* optional */
  void (*device_free)(KilnHostDeviceFreeArgs* args);         /* set with device_alloc */
  void (*cache_dir)(KilnHostCacheDirArgs* args);             /* required */
  void (*get_option)(KilnHostGetOptionArgs* args);           /* required */
  KilnError* (*call_eager)(KilnHostCallEagerArgs* args);     /* optional (NULL in hosts without
                                                                LibTorch, e.g. `kiln plugins`) */
} KilnHostApi;
#define KILN_HOST_API_STRUCT_SIZE KILN_STRUCT_SIZE(KilnHostApi, call_eager)
KILN_CHECK_STRUCT_SIZE(KilnHostApi, KILN_HOST_API_STRUCT_SIZE);

/* ---- Plugin ---------------------------------------------------------------------------------- */
/* plugin_ctx is KilnPluginApi.plugin_ctx. All pointers in the args are borrowed unless a field says
 * otherwise. available, claim, compile and the graph_capture_* calls are made for one context from
 * one thread at a time. */

/* "Can you run on these devices?" Cheap: no device contexts, no compilation. */
typedef struct KilnPluginAvailableArgs {
  size_t struct_size;
  void* plugin_ctx;
  const KilnDeviceInfo* const* devices; /* the hardware probe's list */
  size_t num_devices;
  int32_t available; /* out: nonzero when the plugin can run on these devices */
  int32_t score;     /* out: how strongly "auto" should pick it here; the available plugin
                        with the highest positive score is chosen; 0 = only when named */
  char* reason;      /* out: host-owned buffer of reason_capacity bytes; the plugin writes a
                        NUL-terminated reason, why not or what it will use ("CUDA device 0
                        (NVIDIA H200)"); truncated if longer */
  size_t reason_capacity;
} KilnPluginAvailableArgs;
#define KILN_PLUGIN_AVAILABLE_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnPluginAvailableArgs, reason_capacity)
KILN_CHECK_STRUCT_SIZE(KilnPluginAvailableArgs, KILN_PLUGIN_AVAILABLE_ARGS_STRUCT_SIZE);

/* The nodes the plugin takes. The host checks them: every index in range, no duplicates. */
typedef struct KilnPluginClaimArgs {
  size_t struct_size;
  void* plugin_ctx;
  const KilnGraphView* graph;
  int64_t* claimed_nodes; /* out: host-owned buffer of graph->num_nodes entries; the plugin
                             writes the indices of the nodes it takes */
  size_t num_claimed;     /* out: how many it wrote */
} KilnPluginClaimArgs;
#define KILN_PLUGIN_CLAIM_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnPluginClaimArgs, num_claimed)
KILN_CHECK_STRUCT_SIZE(KilnPluginClaimArgs, KILN_PLUGIN_CLAIM_ARGS_STRUCT_SIZE);

/* Compiles a subgraph (its own inputs and outputs). KILN_ERROR_UNIMPLEMENTED means "run these nodes
 * eagerly": the host does, and goes on. */
typedef struct KilnPluginCompileArgs {
  size_t struct_size;
  void* plugin_ctx;
  const KilnGraphView* subgraph;
  KilnMode mode;                    /* one the descriptor lists */
  int32_t reserved0;                /* 0 */
  const KilnOption* const* options; /* the plugin's [plugin.<name>] table; unknown keys should be
                                       rejected with KILN_ERROR_INVALID_ARGUMENT */
  size_t num_options;
  const char* cache_dir;      /* where the plugin may keep compiled artifacts (its own subfolder of
                                 it is best); never NULL */
  KilnExecutable* executable; /* out: owned by the host until executable_destroy; NULL on error */
  /* 2.2, in-place outputs. Read them only when KILN_HAS_FIELD(args, KilnPluginCompileArgs,
   * inplace_accepted) holds (a 2.1 host does not have them).
   * inplace_inputs: NULL, or subgraph->num_outputs entries. Entry k is -1, or the index j of a
   * subgraph input that output k replaces: output k is input j's new value (a write-back of the
   * step, with the same dtype, shape and strides), nothing outside the subgraph reads input j's old
   * value after it, and the host would like to pass the same memory as outputs[k] and inputs[j].
   * inplace_accepted: host-owned, subgraph->num_outputs entries preset to -1 (NULL when
   * inplace_inputs is). The plugin sets entry k to inplace_inputs[k] when its executable computes
   * output k correctly with outputs[k] and inputs[j] sharing memory (every read of input j happens
   * before, or in the same thread at the same element as, the write that overwrites it). The host
   * may still pass separate memory; any other value is refused. */
  const int64_t* inplace_inputs;
  int64_t* inplace_accepted;
  /* 2.4 (KILN_CAPABILITY_SYMBOLIC_SHAPES): out, preset to 0 by the host. A plugin given a view with
   * symbols sets it to 1 when its executable computes the subgraph at every size: any values of the
   * symbols (each >= 2) at which every size site's expression is an integer, with inputs and
   * outputs of the shapes and strides the expressions give there. Left 0, the executable serves the
   * view's own sizes only, and the host compiles each later size's graph separately, as for a
   * plugin without the capability. In-place pairs accepted hold at every size. */
  int32_t symbolic_accepted;
  /* 2.5: out, preset to 0 by the host (a 2.4 plugin leaves it 0: it was reserved). 1 says that an
   * execute of this executable that returns an error has written into none of the inputs it
   * accepted in place (inplace_accepted): it fails before its first such write, or not at all. The
   * host then keeps no copy of what the step writes for this group: should it fail, the host runs
   * the group's nodes eagerly in its place and goes on with the step. Meaningless, and ignored,
   * without accepted pairs (an executable that writes no input leaves every input as it was). */
  int32_t inplace_atomic;
} KilnPluginCompileArgs;
#define KILN_PLUGIN_COMPILE_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnPluginCompileArgs, inplace_atomic)
KILN_CHECK_STRUCT_SIZE(KilnPluginCompileArgs, KILN_PLUGIN_COMPILE_ARGS_STRUCT_SIZE);

/* Ends a context: called once, after the last executable and graph are destroyed and before the
 * library is unloaded. Frees plugin_ctx (and the table, if the plugin allocated it). */
typedef struct KilnPluginShutdownArgs {
  size_t struct_size;
  void* plugin_ctx;
} KilnPluginShutdownArgs;
#define KILN_PLUGIN_SHUTDOWN_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnPluginShutdownArgs, plugin_ctx)
KILN_CHECK_STRUCT_SIZE(KilnPluginShutdownArgs, KILN_PLUGIN_SHUTDOWN_ARGS_STRUCT_SIZE);

/* ---- Executable ------------------------------------------------------------------------------ */

/* Runs an executable. Called from several threads at once only with
 * KILN_CAPABILITY_CONCURRENT_EXECUTE; never concurrently with executable_destroy of the same one. */
typedef struct KilnExecutableExecuteArgs {
  size_t struct_size;
  KilnExecutable* executable;
  const DLTensor* inputs; /* inputs[i] is subgraph input i */
  size_t num_inputs;
  DLTensor* outputs; /* outputs[i] is subgraph output i, preallocated by the host with that
                        value's dtype, shape and strides: the plugin writes into them and
                        allocates nothing for them */
  size_t num_outputs;
  const KilnArg* const* scalars; /* the current values of the step's run-time scalars: scalars[k] is
                                    run-time scalar k (a BOOL, INT or DOUBLE KilnArg). Only for
                                    plugins with KILN_CAPABILITY_RUNTIME_SCALARS; others get NULL */
  size_t num_scalars;            /* 0 with scalars NULL */
  void* stream;                  /* the device stream to order work on (cudaStream_t on CUDA; NULL
                                    means the default stream; always NULL on the CPU) */
  /* 2.4: for an executable compiled from a view with symbols and accepted for every size, the
   * symbols' values at this call (symbol_values[k] is inputs[symbols[k].input]'s size in dimension
   * symbols[k].dim), every one >= 2; the inputs and outputs have the shapes the size sites give at
   * these values. Otherwise NULL and 0. Read only when KILN_HAS_FIELD(args,
   * KilnExecutableExecuteArgs, num_symbol_values) holds. */
  const int64_t* symbol_values;
  size_t num_symbol_values;
} KilnExecutableExecuteArgs;
#define KILN_EXECUTABLE_EXECUTE_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnExecutableExecuteArgs, num_symbol_values)
KILN_CHECK_STRUCT_SIZE(KilnExecutableExecuteArgs, KILN_EXECUTABLE_EXECUTE_ARGS_STRUCT_SIZE);

/* Frees an executable; the host calls it once per executable, before shutdown. */
typedef struct KilnExecutableDestroyArgs {
  size_t struct_size;
  KilnExecutable* executable;
} KilnExecutableDestroyArgs;
#define KILN_EXECUTABLE_DESTROY_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnExecutableDestroyArgs, executable)
KILN_CHECK_STRUCT_SIZE(KilnExecutableDestroyArgs, KILN_EXECUTABLE_DESTROY_ARGS_STRUCT_SIZE);

/* ---- Device graphs --------------------------------------------------------------------------- */
/* Record the work the host enqueues on a stream, then replay it with one launch (CUDA graphs). A
 * plugin with KILN_CAPABILITY_DEVICE_GRAPHS sets all four functions; others set none. The host owns
 * the memory the recorded work touches (it keeps those tensors alive and at the same addresses
 * while the graph lives); the plugin owns only the graph. */

/* Starts recording the work enqueued on `stream` of `device`. Until graph_capture_end, the calling
 * thread makes no call that would synchronize with the device (the plugin chooses the capture mode;
 * the in-tree cudagraphs plugin uses thread-local mode). */
typedef struct KilnGraphCaptureBeginArgs {
  size_t struct_size;
  void* plugin_ctx;
  DLDevice device;
  void* stream; /* cudaStream_t on CUDA; not the legacy default stream */
} KilnGraphCaptureBeginArgs;
#define KILN_GRAPH_CAPTURE_BEGIN_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnGraphCaptureBeginArgs, stream)
KILN_CHECK_STRUCT_SIZE(KilnGraphCaptureBeginArgs, KILN_GRAPH_CAPTURE_BEGIN_ARGS_STRUCT_SIZE);

/* Since 2.3 (KILN_CAPABILITY_GRAPH_COPIES): one 1-D copy the host enqueued on the capture stream
 * while recording (cudaMemcpyAsync of `bytes` > 0 from `src` to `dst`; device to device, or pinned
 * host to device), whose addresses each launch may change: the new batch copied into the graph's
 * inputs at its start, the results copied out at its end, without work of their own on the stream
 * around the launch. Fixed layout, no struct_size: arrays of it cross the ABI. */
typedef struct KilnGraphCopy {
  void* dst;
  const void* src;
  size_t bytes;
} KilnGraphCopy;

/* Stops recording on `stream` and instantiates the graph. Called after every successful
 * graph_capture_begin, also when the host's work failed half-way: then the plugin ends the capture,
 * discards it and returns the error (naming the device runtime's error, e.g.
 * "cudaErrorStreamCaptureInvalidated"), with `graph` NULL. Errors are KILN_ERROR_UNAVAILABLE (no
 * device or runtime) or KILN_ERROR_INTERNAL. */
typedef struct KilnGraphCaptureEndArgs {
  size_t struct_size;
  void* plugin_ctx;
  DLDevice device;
  void* stream;
  KilnGraphExec* graph; /* out: owned by the host until graph_destroy; NULL on error */
  /* 2.3, read only when KILN_HAS_FIELD(args, KilnGraphCaptureEndArgs, num_copies) holds; set by the
   * host only for a plugin with KILN_CAPABILITY_GRAPH_COPIES. NULL and 0, or the copies the host
   * enqueued during this capture, as it enqueued them: the plugin finds each among the recorded
   * graph's copy nodes (the same dst, src and bytes), keeps them by their index here, and fails with
   * KILN_ERROR_INTERNAL when one is not there exactly once. */
  const KilnGraphCopy* copies;
  size_t num_copies;
} KilnGraphCaptureEndArgs;
#define KILN_GRAPH_CAPTURE_END_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnGraphCaptureEndArgs, num_copies)
KILN_CHECK_STRUCT_SIZE(KilnGraphCaptureEndArgs, KILN_GRAPH_CAPTURE_END_ARGS_STRUCT_SIZE);

/* Enqueues one replay of `graph` on `stream` (any stream of the graph's device). */
typedef struct KilnGraphLaunchArgs {
  size_t struct_size;
  KilnGraphExec* graph;
  void* stream;
  /* 2.3 (KILN_CAPABILITY_GRAPH_COPIES; read only when KILN_HAS_FIELD(args, KilnGraphLaunchArgs,
   * num_copies) holds). NULL and 0: replay the copies as they were last launched. Otherwise exactly
   * the num_copies of graph_capture_end, in its order and with its byte counts: the addresses this
   * replay copies between (the same kind of memory, on the graph's device, as when recorded). The
   * plugin re-points the copies whose addresses changed before it enqueues the replay; replays
   * already enqueued keep theirs (cudaGraphExecMemcpyNodeSetParams1D). A mismatch is
   * KILN_ERROR_INVALID_ARGUMENT, and nothing is launched. */
  const KilnGraphCopy* copies;
  size_t num_copies;
} KilnGraphLaunchArgs;
#define KILN_GRAPH_LAUNCH_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnGraphLaunchArgs, num_copies)
KILN_CHECK_STRUCT_SIZE(KilnGraphLaunchArgs, KILN_GRAPH_LAUNCH_ARGS_STRUCT_SIZE);

/* Frees `graph`; work already launched completes. The host calls it once per graph. */
typedef struct KilnGraphDestroyArgs {
  size_t struct_size;
  KilnGraphExec* graph;
} KilnGraphDestroyArgs;
#define KILN_GRAPH_DESTROY_ARGS_STRUCT_SIZE KILN_STRUCT_SIZE(KilnGraphDestroyArgs, graph)
KILN_CHECK_STRUCT_SIZE(KilnGraphDestroyArgs, KILN_GRAPH_DESTROY_ARGS_STRUCT_SIZE);

/* ---- Plugin API (the plugin's table, returned by kiln_plugin_init) --------------------------- */

/* Plugin-owned: the table, its plugin_ctx and its descriptor live until shutdown returns. New
 * functions are only ever added at the end. */
typedef struct KilnPluginApi {
  /* The first six fields keep their place and signatures in every ABI major, so that a host can
   * read the version of a plugin built for another major and the message of a failed init. */
  size_t struct_size;
  uint32_t abi_major; /* the ABI the plugin was built for: KILN_ABI_VERSION_* */
  uint32_t abi_minor;
  KilnErrorCode (*error_code)(const KilnError* error);
  const char* (*error_message)(const KilnError* error); /* lives as long as `error` */
  void (*error_destroy)(KilnError* error);

  void* plugin_ctx;                       /* opaque; goes into the args below */
  const KilnPluginDescriptor* descriptor; /* required */
  /* Optional (NULL: available wherever a device of its kinds is, with descriptor->default_score). */
  KilnError* (*available)(KilnPluginAvailableArgs* args);
  KilnError* (*claim)(KilnPluginClaimArgs* args);              /* required */
  KilnError* (*compile)(KilnPluginCompileArgs* args);          /* required */
  void (*shutdown)(KilnPluginShutdownArgs* args);              /* optional */
  KilnError* (*execute)(KilnExecutableExecuteArgs* args);      /* required */
  void (*executable_destroy)(KilnExecutableDestroyArgs* args); /* required */
  /* KILN_CAPABILITY_DEVICE_GRAPHS: all four; otherwise NULL. */
  KilnError* (*graph_capture_begin)(KilnGraphCaptureBeginArgs* args);
  KilnError* (*graph_capture_end)(KilnGraphCaptureEndArgs* args);
  KilnError* (*graph_launch)(KilnGraphLaunchArgs* args);
  void (*graph_destroy)(KilnGraphDestroyArgs* args);
} KilnPluginApi;
#define KILN_PLUGIN_API_STRUCT_SIZE KILN_STRUCT_SIZE(KilnPluginApi, graph_destroy)
KILN_CHECK_STRUCT_SIZE(KilnPluginApi, KILN_PLUGIN_API_STRUCT_SIZE);

/* The frozen first fields alone: what a host may read from a table of any major. */
#define KILN_PLUGIN_API_HEADER_SIZE KILN_STRUCT_SIZE(KilnPluginApi, error_destroy)

/* ---- Entry point ----------------------------------------------------------------------------- */

/* The one symbol a plugin exports; its signature is frozen across majors (see the top). `host`
 * lives until shutdown returns. host_abi_major/minor are the host's version (also in
 * host->abi_*). The plugin sets *out to its table and returns NULL; or it returns an error (code
 * KILN_ERROR_ABI_MISMATCH when the majors differ) and still sets *out when it can, at least to a
 * table whose first six fields are valid, so that the host can read the plugin's version and the
 * message with (*out)->error_message and free it with (*out)->error_destroy. A host may call it
 * more than once (one context per call, each ended by its own shutdown). */
typedef KilnError* (*KilnPluginInitFn)(const KilnHostApi* host, uint32_t host_abi_major, uint32_t host_abi_minor,
                                       const KilnPluginApi** out);

KILN_PLUGIN_EXPORT KilnError* kiln_plugin_init(const KilnHostApi* host, uint32_t host_abi_major,
                                               uint32_t host_abi_minor, const KilnPluginApi** out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_PLUGIN_API_H_ */
