/* A plugin written in plain C99 against kiln/plugin_api.h, built several times with one defect
 * each (BAD_*), for the loader tests. Without a BAD_* define it is a good plugin whose compiled
 * executables copy float32 input i to output i. */
#include <stdlib.h>
#include <string.h>

#include <kiln/plugin_api.h>

#ifndef PLUGIN_NAME
#error "define PLUGIN_NAME"
#endif

struct KilnError {
  KilnErrorCode code;
  const char* message; /* static strings only in this plugin */
};

struct KilnExecutable {
  int unused;
};

static KilnErrorCode err_code(const KilnError* e) { return e->code; }
static const char* err_message(const KilnError* e) { return e->message; }
static void err_destroy(KilnError* e) { free(e); }

static KilnError* make_error(KilnErrorCode code, const char* message) {
  KilnError* e = (KilnError*)malloc(sizeof *e);
  e->code = code;
  e->message = message;
  return e;
}

/* Live contexts; init adds one and shutdown removes it. */
static int g_contexts = 0;

static KilnError* plugin_available(void* ctx, const KilnDeviceInfo* const* devices, size_t n,
                                   KilnAvailability* out) {
  (void)ctx;
  (void)devices;
  out->available = n > 0;
  strncpy(out->reason, n > 0 ? "has devices" : "no devices", out->reason_capacity - 1);
  return NULL;
}

static KilnError* plugin_claim(void* ctx, const KilnGraphView* graph, int64_t* claimed, size_t* num_claimed) {
  size_t i;
  (void)ctx;
#if defined(BAD_CLAIMS_OUT_OF_RANGE)
  claimed[0] = 0;
  claimed[1] = (int64_t)graph->num_nodes + 4;
  *num_claimed = 2;
#elif defined(BAD_CLAIMS_DUPLICATE)
  claimed[0] = 0;
  claimed[1] = 0;
  *num_claimed = 2;
#else
  for (i = 0; i < graph->num_nodes; ++i) claimed[i] = (int64_t)i;
  *num_claimed = graph->num_nodes;
#endif
  return NULL;
}

static KilnError* plugin_compile(void* ctx, const KilnGraphView* graph, const KilnCompileOptions* options,
                                 KilnExecutable** out) {
  (void)ctx;
  (void)graph;
  (void)options;
#if defined(BAD_COMPILE_FAILS)
  *out = NULL;
  return make_error(KILN_ERROR_INVALID_ARGUMENT, "node 0 (aten::mul.Tensor): float64 is not supported");
#else
  *out = (KilnExecutable*)calloc(1, sizeof(KilnExecutable));
  return NULL;
#endif
}

static KilnError* plugin_execute(KilnExecutable* exe, const DLTensor* inputs, size_t n_in, DLTensor* outputs,
                                 size_t n_out, void* stream) {
  size_t i, k, numel;
  int d;
  (void)exe;
  (void)stream;
  if (n_in != n_out) return make_error(KILN_ERROR_INVALID_ARGUMENT, "inputs and outputs differ in count");
  for (i = 0; i < n_in; ++i) {
    numel = 1;
    for (d = 0; d < inputs[i].ndim; ++d) numel *= (size_t)inputs[i].shape[d];
    for (k = 0; k < numel; ++k)
      ((float*)outputs[i].data)[k] = ((const float*)inputs[i].data)[k];
  }
  return NULL;
}

static void plugin_executable_destroy(KilnExecutable* exe) { free(exe); }

static void plugin_shutdown(void* ctx) {
  (void)ctx;
  --g_contexts;
}

static const KilnPluginDescriptor g_descriptor = {
    KILN_PLUGIN_DESCRIPTOR_STRUCT_SIZE,
#if defined(BAD_NULL_NAME)
    NULL,
#else
    PLUGIN_NAME,
#endif
    "1.2.3",
    "kiln tests",
    "a C plugin for the loader tests",
    KILN_DEVICE_MASK_CPU,
    KILN_MODE_BIT(KILN_MODE_DEFAULT) | KILN_MODE_BIT(KILN_MODE_MAX_AUTOTUNE),
    1,
    0};

static KilnPluginApi g_api;

KILN_PLUGIN_EXPORT KilnError* kiln_plugin_init(const KilnHostApi* host, uint32_t host_abi_major,
                                               uint32_t host_abi_minor, const KilnPluginApi** out) {
  (void)host;
  (void)host_abi_major;
  (void)host_abi_minor;
  memset(&g_api, 0, sizeof g_api);
  g_api.struct_size = KILN_PLUGIN_API_STRUCT_SIZE;
  g_api.abi_major = KILN_ABI_VERSION_MAJOR;
  g_api.abi_minor = KILN_ABI_VERSION_MINOR;
  g_api.error_code = err_code;
  g_api.error_message = err_message;
  g_api.error_destroy = err_destroy;
  g_api.plugin_ctx = &g_api;
  g_api.descriptor = &g_descriptor;
  g_api.available = plugin_available;
  g_api.claim = plugin_claim;
  g_api.compile = plugin_compile;
  g_api.execute = plugin_execute;
  g_api.executable_destroy = plugin_executable_destroy;
  g_api.shutdown = plugin_shutdown;
#if defined(BAD_ABI_MAJOR)
  g_api.abi_major = KILN_ABI_VERSION_MAJOR + 1;
#endif
#if defined(NEWER_MINOR)
  g_api.abi_minor = KILN_ABI_VERSION_MINOR + 7;
#endif
#if defined(BAD_UNDERSIZED)
  g_api.struct_size = offsetof(KilnPluginApi, plugin_ctx);
#endif
#if defined(BAD_NULL_EXECUTE)
  g_api.execute = NULL;
#endif
  *out = &g_api;
#if defined(BAD_INIT_FAILS)
  return make_error(KILN_ERROR_UNAVAILABLE, "license server license.example:27000 unreachable");
#else
  ++g_contexts;
  return NULL;
#endif
}
