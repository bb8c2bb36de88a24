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

static KilnError* plugin_available(KilnPluginAvailableArgs* args) {
  args->available = args->num_devices > 0;
  args->score = 0; /* a test plugin: used only when named */
  strncpy(args->reason, args->num_devices > 0 ? "has devices" : "no devices", args->reason_capacity - 1);
  return NULL;
}

static KilnError* plugin_claim(KilnPluginClaimArgs* args) {
#if defined(BAD_CLAIMS_OUT_OF_RANGE)
  args->claimed_nodes[0] = 0;
  args->claimed_nodes[1] = (int64_t)args->graph->num_nodes + 4;
  args->num_claimed = 2;
#elif defined(BAD_CLAIMS_DUPLICATE)
  args->claimed_nodes[0] = 0;
  args->claimed_nodes[1] = 0;
  args->num_claimed = 2;
#else
  for (size_t i = 0; i < args->graph->num_nodes; ++i) args->claimed_nodes[i] = (int64_t)i;
  args->num_claimed = args->graph->num_nodes;
#endif
  return NULL;
}

static KilnError* plugin_compile(KilnPluginCompileArgs* args) {
#if defined(BAD_COMPILE_FAILS)
  args->executable = NULL;
  return make_error(KILN_ERROR_INVALID_ARGUMENT, "node 0 (aten::mul.Tensor): float64 is not supported");
#else
  args->executable = (KilnExecutable*)calloc(1, sizeof(KilnExecutable));
  return NULL;
#endif
}

static KilnError* plugin_execute(KilnExecutableExecuteArgs* args) {
  size_t i, k, numel;
  int d;
  if (args->num_inputs != args->num_outputs)
    return make_error(KILN_ERROR_INVALID_ARGUMENT, "inputs and outputs differ in count");
  for (i = 0; i < args->num_inputs; ++i) {
    const DLTensor* in = &args->inputs[i];
    numel = 1;
    for (d = 0; d < in->ndim; ++d) numel *= (size_t)in->shape[d];
    for (k = 0; k < numel; ++k) ((float*)args->outputs[i].data)[k] = ((const float*)in->data)[k];
  }
  return NULL;
}

static void plugin_executable_destroy(KilnExecutableDestroyArgs* args) { free(args->executable); }

static void plugin_shutdown(KilnPluginShutdownArgs* args) {
  (void)args;
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
    KILN_CAPABILITY_CONCURRENT_EXECUTE,
    0,
    0};

static KilnPluginApi g_api;

#if defined(BAD_REPORTS_ABI_1_2)
/* A 2.x table that says it is 1.2 (a plugin with a stale version constant). A host that refuses it
 * may read the frozen first fields and nothing else: every other slot is a trap, and the descriptor
 * points nowhere. In a 1.x table, the slot where this one has executable_destroy is shutdown. */
#include <stdio.h>
static void trap(const char* slot) {
  fprintf(stderr, "c_plugin: the host called '%s' of a table it had to refuse\n", slot);
  abort();
}
static KilnError* trap_available(KilnPluginAvailableArgs* a) {
  (void)a;
  trap("available");
  return NULL;
}
static KilnError* trap_claim(KilnPluginClaimArgs* a) {
  (void)a;
  trap("claim");
  return NULL;
}
static KilnError* trap_compile(KilnPluginCompileArgs* a) {
  (void)a;
  trap("compile");
  return NULL;
}
static void trap_shutdown(KilnPluginShutdownArgs* a) {
  (void)a;
  trap("shutdown");
}
static KilnError* trap_execute(KilnExecutableExecuteArgs* a) {
  (void)a;
  trap("execute");
  return NULL;
}
static void trap_executable_destroy(KilnExecutableDestroyArgs* a) {
  (void)a;
  trap("executable_destroy");
}
#endif

#if defined(BAD_EXECUTE_CRASHES)
/* Executes crash on the third call, as a plugin with a memory bug does some way into a training. */
static KilnError* crashing_execute(KilnExecutableExecuteArgs* args) {
  static int calls = 0;
  if (++calls == 3) {
    volatile uintptr_t nowhere = 8; /* hidden from the compiler, which would refuse a constant */
    *(volatile int*)nowhere = 1;
  }
  return plugin_execute(args);
}
#endif

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
  g_api.struct_size = KILN_PLUGIN_API_HEADER_SIZE;
#endif
#if defined(BAD_NULL_EXECUTE)
  g_api.execute = NULL;
#endif
#if defined(BAD_EXECUTE_CRASHES)
  g_api.execute = crashing_execute;
#endif
#if defined(BAD_REPORTS_ABI_1_2)
  g_api.abi_major = 1;
  g_api.abi_minor = 2;
  g_api.descriptor = (const KilnPluginDescriptor*)(uintptr_t)16;
  g_api.available = trap_available;
  g_api.claim = trap_claim;
  g_api.compile = trap_compile;
  g_api.shutdown = trap_shutdown;
  g_api.execute = trap_execute;
  g_api.executable_destroy = trap_executable_destroy;
#endif
  *out = &g_api;
#if defined(BAD_INIT_FAILS)
  return make_error(KILN_ERROR_UNAVAILABLE, "license server license.example:27000 unreachable");
#else
  ++g_contexts;
  return NULL;
#endif
}
