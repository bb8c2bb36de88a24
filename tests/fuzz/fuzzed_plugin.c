/* A kiln plugin whose every answer comes from the fuzzer's input, for fuzz_plugin_returns: its
 * function table, descriptor, availability, claims, compile result (executable or not, in-place
 * acceptances) and errors (codes and messages) are read from the bytes the fuzz target exports as
 * kiln_fuzz_plugin_input. Its table may say any ABI version and, for another major, have the 1.2
 * layout or a 2.x one with every slot past the frozen first fields a trap. It keeps to what the ABI lets a plugin do
 * with memory (it writes only into the buffers the host hands it, within their sizes) and lies about everything else,
 * so that the host's checks of what plugins return are what is being fuzzed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/plugin_api.h"

struct KilnFuzzInput {
  const uint8_t* data;
  size_t size;
  size_t at;
};

struct KilnError {
  KilnErrorCode code;
  char* message; /* may be NULL: a plugin that says nothing */
};

struct KilnExecutable {
  int unused;
};

static struct KilnFuzzInput* in(void) {
  static struct KilnFuzzInput* p = NULL;
  if (!p) p = (struct KilnFuzzInput*)dlsym(RTLD_DEFAULT, "kiln_fuzz_plugin_input");
  return p;
}
static uint8_t next(void) {
  struct KilnFuzzInput* p = in();
  if (!p || p->at >= p->size) return 0;
  return p->data[p->at++];
}
static uint32_t next32(void) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | next();
  return v;
}
/* A string of up to 15 bytes from the input (any bytes but NUL), owned by the caller. */
static char* next_string(void) {
  const size_t n = next() % 16;
  char* s = (char*)malloc(n + 1);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t c = next();
    s[i] = c ? (char)c : 'a';
  }
  s[n] = 0;
  return s;
}

static KilnErrorCode err_code(const KilnError* e) { return e->code; }
static const char* err_message(const KilnError* e) { return e->message; }
static void err_destroy(KilnError* e) {
  if (!e) return;
  free(e->message);
  free(e);
}
/* Whether the table has the error functions: without them the host cannot free an error, so the
 * plugin hands out one that needs no freeing (a leak would be the plugin's, not the host's). */
static int errors_freeable = 1;
static KilnError static_error = {KILN_ERROR_INTERNAL, NULL};

/* An error with a code and message from the input (any code value, a NULL message sometimes). */
static KilnError* make_error(void) {
  if (!errors_freeable) return &static_error;
  KilnError* e = (KilnError*)malloc(sizeof *e);
  e->code = (KilnErrorCode)(next() % 12);
  e->message = next() % 4 == 0 ? NULL : next_string();
  return e;
}

static KilnPluginDescriptor descriptor;
static KilnPluginApi api;
static char *name, *version, *vendor;

static KilnError* available(KilnPluginAvailableArgs* a) {
  if (next() % 5 == 0) return make_error();
  a->available = (int32_t)next32();
  a->score = (int32_t)next32();
  /* A short reason, or the whole buffer without a NUL: the host must end it itself. */
  const uint8_t how = next();
  if (how & 1) {
    memset(a->reason, 'x', a->reason_capacity);
  } else if (a->reason_capacity > 0) {
    size_t n = how % 32;
    if (n >= a->reason_capacity) n = a->reason_capacity - 1;
    for (size_t i = 0; i < n; ++i) a->reason[i] = (char)(next() | 1);
    a->reason[n] = 0;
  }
  return NULL;
}

static KilnError* claim(KilnPluginClaimArgs* a) {
  if (next() % 5 == 0) return make_error();
  const size_t n = a->graph ? a->graph->num_nodes : 0;
  const size_t count = next() % 8;
  for (size_t i = 0; i < count && i < n; ++i) a->claimed_nodes[i] = (int64_t)(int8_t)next();
  a->num_claimed = count;
  return NULL;
}

static KilnError* compile(KilnPluginCompileArgs* a) {
  const uint8_t how = next() % 4;
  if (how == 0) return make_error();
  if (how == 1) return NULL; /* neither an executable nor an error */
  a->executable = (KilnExecutable*)calloc(1, sizeof(KilnExecutable));
  if (a->subgraph && KILN_HAS_FIELD(a, KilnPluginCompileArgs, inplace_accepted) && a->inplace_accepted)
    for (size_t k = 0; k < a->subgraph->num_outputs; ++k) a->inplace_accepted[k] = (int64_t)(int8_t)next();
  return how == 3 ? make_error() : NULL; /* 3: an error and an executable */
}

static KilnError* execute(KilnExecutableExecuteArgs* a) {
  (void)a;
  return next() % 3 == 0 ? make_error() : NULL;
}

static void executable_destroy(KilnExecutableDestroyArgs* a) { free(a->executable); }

static void shutdown_plugin(KilnPluginShutdownArgs* a) {
  (void)a;
  free(name);
  free(version);
  free(vendor);
  name = version = vendor = NULL;
}

/* A table too small to hold `shutdown` (refused by the host, which then cannot end the context):
 * the strings go when the library is unloaded. */
__attribute__((destructor)) static void unload(void) { shutdown_plugin(NULL); }

static KilnError* graph_begin(KilnGraphCaptureBeginArgs* a) {
  (void)a;
  return make_error();
}

/* The 1.2 function table, field for field: the layout a table of another major may have. Its
 * shutdown sits where a 2.x table has executable_destroy. */
typedef struct {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  KilnErrorCode (*error_code)(const KilnError* error);
  const char* (*error_message)(const KilnError* error);
  void (*error_destroy)(KilnError* error);
  void* plugin_ctx;
  const void* descriptor;
  void* available;
  void* claim;
  void* compile;
  void* execute;
  void* executable_destroy;
  void (*shutdown)(void* plugin_ctx);
  void* execute_with_scalars;
  void* graph_capture_begin;
  void* graph_capture_end;
  void* graph_launch;
  void* graph_destroy;
} PluginApiV1_2;

/* A table of another major: anything past its frozen first fields is the host's to leave alone.
 * Every such slot is a trap and every pointer leads to memory that cannot be read, so the fuzzer
 * stops on a host that reads or calls one. */
static void trap(void) {
  static const char msg[] = "fuzzed_plugin: the host called a slot of a table of another ABI major\n";
  (void)!write(2, msg, sizeof msg - 1);
  abort();
}
static void* unreadable(void) {
  static void* page = NULL;
  if (!page) page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return page;
}
static union {
  KilnPluginApi v2;
  PluginApiV1_2 v1;
  void* slots[32];
} foreign;

/* The version a table says: the host's, 1.x, 0, the next majors, the largest, or any. */
static uint32_t fuzzed_major(uint32_t host_major) {
  switch (next() % 8) {
    case 0: return 1;
    case 1: return 0;
    case 2: return host_major + 1 + next() % 2;
    case 3: return UINT32_MAX;
    case 4: return next32();
    default: return host_major;
  }
}

/* A table of another major in the 1.2 layout or a 2.x one (2.0 ... this SDK's size), its slots
 * trapped; its error functions valid when the input says so. */
static const KilnPluginApi* foreign_table(uint32_t major, uint32_t minor, int with_errors) {
  static const size_t sizes[6] = {sizeof(PluginApiV1_2),
                                  KILN_STRUCT_SIZE(PluginApiV1_2, shutdown),
                                  KILN_STRUCT_SIZE(KilnPluginApi, graph_destroy),
                                  KILN_PLUGIN_API_STRUCT_SIZE,
                                  KILN_PLUGIN_API_HEADER_SIZE,
                                  sizeof foreign};
  const size_t first = offsetof(KilnPluginApi, plugin_ctx) / sizeof(void*);
  for (size_t i = first; i < sizeof foreign.slots / sizeof foreign.slots[0]; ++i)
    foreign.slots[i] = (i % 2) ? unreadable() : (void*)trap;
  foreign.v2.struct_size = sizes[next() % 6];
  foreign.v2.abi_major = major;
  foreign.v2.abi_minor = minor;
  foreign.v2.error_code = with_errors ? err_code : NULL;
  foreign.v2.error_message = with_errors ? err_message : NULL;
  foreign.v2.error_destroy = with_errors ? err_destroy : NULL;
  return &foreign.v2;
}

KILN_PLUGIN_EXPORT KilnError* kiln_plugin_init(const KilnHostApi* host, uint32_t host_major, uint32_t host_minor,
                                               const KilnPluginApi** out) {
  (void)host;
  (void)host_minor;
  memset(&api, 0, sizeof api);
  memset(&descriptor, 0, sizeof descriptor);
  const uint8_t shape = next();
  const uint32_t major = fuzzed_major(host_major);
  const uint32_t minor = next() % 2 ? next() % 5 : next32();
  if (major != host_major) {
    const int with_errors = !(next() & 1);
    errors_freeable = with_errors;
    *out = shape & 8 ? NULL : foreign_table(major, minor, with_errors);
    errors_freeable = errors_freeable && *out && foreign.v2.struct_size >= KILN_PLUGIN_API_HEADER_SIZE;
    return shape & 16 ? make_error() : NULL;
  }
  static const size_t sizes[4] = {KILN_PLUGIN_API_STRUCT_SIZE, KILN_PLUGIN_API_HEADER_SIZE,
                                  KILN_STRUCT_SIZE(KilnPluginApi, executable_destroy), 7};
  api.struct_size = sizes[shape % 4];
  api.abi_major = major;
  api.abi_minor = minor;
  const uint8_t fns = next();
  errors_freeable = !(fns & 1);
  if (!(fns & 1)) {
    api.error_code = err_code;
    api.error_message = err_message;
    api.error_destroy = err_destroy;
  }
  if (!(fns & 2)) api.claim = claim;
  if (!(fns & 4)) api.compile = compile;
  if (!(fns & 8)) api.execute = execute;
  if (!(fns & 16)) api.executable_destroy = executable_destroy;
  if (fns & 32) api.available = available;
  if (fns & 64) api.graph_capture_begin = graph_begin; /* one of four: refused */
  api.shutdown = shutdown_plugin;
  free(name);
  free(version);
  free(vendor);
  name = next() % 8 == 0 ? NULL : next_string();
  version = next() % 8 == 0 ? NULL : next_string();
  vendor = next() % 8 == 0 ? NULL : next_string();
  static const size_t dsizes[4] = {KILN_PLUGIN_DESCRIPTOR_STRUCT_SIZE, KILN_PLUGIN_DESCRIPTOR_STRUCT_SIZE, 8,
                                   KILN_PLUGIN_DESCRIPTOR_STRUCT_SIZE + 8};
  descriptor.struct_size = dsizes[next() % 4];
  descriptor.name = name;
  descriptor.version = version;
  descriptor.vendor = vendor;
  descriptor.description = next() % 2 ? "fuzzed" : NULL;
  descriptor.device_kinds = next32();
  descriptor.modes = next32();
  descriptor.capabilities = ((uint64_t)next32() << 32) | next32();
  descriptor.default_score = (int32_t)next32();
  api.descriptor = fns & 128 ? NULL : &descriptor;
  *out = shape & 8 ? NULL : &api;
  /* Without a table, or one too small to reach the error functions, the host cannot free an error. */
  errors_freeable = errors_freeable && *out && api.struct_size >= KILN_PLUGIN_API_HEADER_SIZE;
  return shape & 16 ? make_error() : NULL;
}
