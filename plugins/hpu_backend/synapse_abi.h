// The part of Intel Gaudi's Synapse C API that the hpu_backend calls, declared by kiln from the
// public documentation of SynapseAI (synapse_api.h, synapse_api_types.h, synapse_common_types.h and
// perf_lib_layer_params.h in HabanaAI's repositories): the handle types, the enums and structs
// crossing the calls, the kernels' parameter structs, and one function pointer type per entry
// point. Nothing here links against libSynapse.so; synapse_runtime.cpp looks every entry point up
// with dlsym, so the plugin loads on machines without it. The stand-in library the tests build
// (tests/unit/hpu_backend/fake_synapse.cpp) implements these same declarations.
//
// Enum values and struct layouts must match the real library bit for bit: they are checked only
// against our reading of those headers, and against the stand-in (docs/backends/hpu_backend.md).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::hpu::syn {

// ---- Handles (opaque pointers and integer ids owned by the library) ----------------------------
struct Tensor_;
struct Graph_;
struct Recipe_;
struct Section_;
struct Stream_;
using TensorHandle = Tensor_*;
using GraphHandle = Graph_*;
using RecipeHandle = Recipe_*;
using SectionHandle = Section_*;
using StreamHandle = Stream_*;
using DeviceId = uint32_t;

// ---- Enums ---------------------------------------------------------------------------------------
// synStatus: 0 is success; the others that the backend names in its messages.
enum Status : int32_t {
  kSuccess = 0,
  kInvalidArgument = 1,
  kOutOfHostMemory = 3,
  kOutOfDeviceMemory = 4,
  kObjectNotInitialized = 6,
  kNoDeviceFound = 8,
  kDeviceTypeMismatch = 9,
  kFailedToAllocateDeviceMemory = 14,
  kDeviceReset = 17,
  kUnsupported = 18,
  kDeviceAlreadyAcquired = 20,
  kNameIsAlreadyUsed = 21,
  kBusy = 22,
  kUnavailable = 24,
  kInvalidTensorDimensions = 25,
  kFail = 26,
  kOutOfResources = 27,
  kUninitialized = 28,
  kAlreadyInitialized = 29,
};

// synDeviceType: the graph is created for the acquired device's type.
enum DeviceType : int32_t {
  kDeviceGaudi = 2,
  kDeviceGaudi2 = 4,
  kDeviceGaudi3 = 5,
};

// synDataType: a bit per type.
enum DataType : int32_t {
  kTypeInt8 = 1 << 0,
  kTypeBf16 = 1 << 1,
  kTypeFloat = 1 << 2,
  kTypeInt16 = 1 << 3,
  kTypeInt32 = 1 << 4,
};

// synTensorType: data tensors, and shape tensors, which hold no data: their sizes, given at each
// launch, tell a node of a recipe compiled for a range of sizes (a reshape) the sizes it outputs.
enum TensorType : int32_t { kDataTensor = 0, kShapeTensor = 1 };

// synDmaDir.
enum DmaDir : int32_t { kHostToDram = 0, kDramToHost = 1, kDramToDram = 2 };

// synGeometryType: a static shape sets the sizes only (the same as the maximum sizes); a tensor
// whose sizes change between launches of one recipe sets its minimum sizes too, and each launch
// gives its actual sizes (LaunchTensorInfo::tensor_size) within the two.
enum GeometryType : int32_t { kGeometryMinSizes = 0, kGeometryMaxSizes = 1, kGeometrySizes = kGeometryMaxSizes };

constexpr int kDimMax = 25;  // HABANA_DIM_MAX

// ---- Structs crossing the calls ------------------------------------------------------------------
// synTensorGeometry: sizes with the fastest-changing dim first (the reverse of ATen's order).
struct TensorGeometry {
  uint64_t sizes[kDimMax];
  uint32_t dims;
};

// synLaunchTensorInfoExt: where each persistent tensor lives for one launch.
struct LaunchTensorInfo {
  const char* tensor_name;
  uint64_t device_address;
  int32_t tensor_type;  // TensorType
  uint64_t tensor_size[kDimMax];
  uint64_t tensor_id;
};

// synDeviceInfo (the fields up to the device type).
struct DeviceInfo {
  uint64_t sram_base_address;
  uint64_t dram_base_address;
  uint32_t sram_size;
  uint64_t dram_size;
  uint64_t tpc_enabled_mask;
  uint8_t dram_enabled;
  uint32_t device_id;
  uint32_t fd;
  int32_t device_type;  // DeviceType
};

// ---- Kernel parameters (passed to synNodeCreate by pointer and size) ------------------------------
// MME gemm / batch_gemm: out = op(a) x op(b), op transposing the two fastest dims when set.
struct GemmParams {
  bool transpose_a;
  bool transpose_b;
};

// A float or an int, as the TPC kernels take scalar parameters.
union FloatOrInt {
  float f;
  int32_t i;
};

// constant_<type>: fills its output with one value.
struct ConstantParams {
  FloatOrInt constant;
};

// reduce_sum_fwd / reduce_mean_fwd: reduce one dim (fastest-first numbering), kept with size 1.
struct ReductionParams {
  uint32_t reduction_dimension;
};

// softmax_fwd / logsoftmax_fwd and their bwd: along one dim (fastest-first numbering).
struct SoftmaxParams {
  int32_t dim;
};

// nll_loss_fwd / nll_loss_bwd: the reduction, and the target value that contributes nothing.
enum NllLossMode : int32_t { kNllMean = 0, kNllSum = 1, kNllNone = 2 };
struct NllLossParams {
  int32_t mode;  // NllLossMode
  int32_t ignore_index;
};

// layer_norm_fwd / layer_norm_bwd: over the fastest dim, with its epsilon.
struct LayerNormParams {
  bool eps_valid;
  float eps;
};

// batch_norm_fwd / batch_norm_bwd: per channel (the fastest dim of NHWC tensors), over the others;
// in training the forward normalizes with the batch's statistics and updates the running ones
// with momentum. threshold is read by the integer kernels only.
struct BatchNormParams {
  FloatOrInt threshold;
  float momentum;
  float epsilon;
  bool is_training;
};

// gelu_fwd / gelu_bwd: the tanh approximation when set, else the exact (erf) form.
struct GeluParams {
  bool approximation;
};

// gather_fwd: rows of the table along one dim (fastest-first numbering) picked by int32 indices.
struct GatherParams {
  int32_t axis;
};

// embedding_dense_pt_bwd: the gradient of an embedding table of num_weights rows.
struct EmbeddingBackwardParams {
  int32_t num_weights;
  int32_t padding_idx;
  bool scale_grad_by_freq;
};

// spatial_convolution, dedx, dedw (MME, 2-d): kernel, stride, padding and dilation by width and
// height, a fused activation (not asked for), groups. Tensors are NHWC: input and output sizes
// {C, W, H, N}, weights {K, C, S, R}, fastest first.
struct ActivationParams {
  bool relu_enable;
  bool residual_after_activation;
  uint16_t struct_padding;
  uint32_t num_channels;
  uint64_t negative_coefficients;
  uint64_t positive_coefficients;
};
struct ConvolutionParams {
  uint32_t kernel_w, kernel_h;
  uint32_t stride_w, stride_h;
  int32_t pad_left, pad_right, pad_top, pad_bottom;
  uint32_t dilation_w, dilation_h;
  ActivationParams activation;
  uint32_t groups;
  uint32_t struct_padding;
};

// transpose: output dim k is input dim permutation[k] (fastest-first numbering).
constexpr int kMaxDimensions = 5;
struct TransposeParams {
  int32_t permutation[kMaxDimensions];
  uint32_t tensor_dim;
};

// ---- Entry points (C linkage, looked up by these names) -------------------------------------------
extern "C" {
using InitializeFn = Status (*)();
using DestroyFn = Status (*)();
using DeviceAcquireFn = Status (*)(DeviceId* device, const char* pci_bus);
using DeviceReleaseFn = Status (*)(DeviceId device);
using DeviceGetInfoFn = Status (*)(DeviceId device, DeviceInfo* info);
using StreamCreateGenericFn = Status (*)(StreamHandle* stream, DeviceId device, uint32_t flags);
using StreamDestroyFn = Status (*)(StreamHandle stream);
using StreamSynchronizeFn = Status (*)(StreamHandle stream);
using GraphCreateFn = Status (*)(GraphHandle* graph, int32_t device_type);
using GraphDestroyFn = Status (*)(GraphHandle graph);
using SectionCreateFn = Status (*)(SectionHandle* section, uint64_t descriptor, GraphHandle graph);
using SectionDestroyFn = Status (*)(SectionHandle section);
using TensorHandleCreateFn = Status (*)(TensorHandle* tensor, GraphHandle graph, int32_t type, const char* name);
using TensorAssignToSectionFn = Status (*)(TensorHandle tensor, SectionHandle section, uint64_t byte_offset);
using TensorSetGeometryFn = Status (*)(TensorHandle tensor, const TensorGeometry* geometry, int32_t geometry_type);
using TensorSetDeviceDataTypeFn = Status (*)(TensorHandle tensor, int32_t data_type);
using TensorDestroyFn = Status (*)(TensorHandle tensor);
using NodeCreateFn = Status (*)(GraphHandle graph, const TensorHandle* inputs, const TensorHandle* outputs,
                                uint32_t num_inputs, uint32_t num_outputs, const void* params, unsigned params_size,
                                const char* guid, const char* name, const char** input_layouts,
                                const char** output_layouts);
using GraphCompileFn = Status (*)(RecipeHandle* recipe, GraphHandle graph, const char* recipe_name,
                                  const char* build_log);
using RecipeDestroyFn = Status (*)(RecipeHandle recipe);
using RecipeSerializeFn = Status (*)(RecipeHandle recipe, const char* file);
using RecipeDeserializeFn = Status (*)(RecipeHandle* recipe, const char* file);
using WorkspaceGetSizeFn = Status (*)(uint64_t* size, RecipeHandle recipe);
using TensorRetrieveIdsFn = Status (*)(RecipeHandle recipe, const char** names, uint64_t* ids, uint32_t count);
using DeviceMallocFn = Status (*)(DeviceId device, uint64_t size, uint64_t requested_address, uint32_t flags,
                                  uint64_t* address);
using DeviceFreeFn = Status (*)(DeviceId device, uint64_t address, uint32_t flags);
using HostMapFn = Status (*)(DeviceId device, uint64_t size, const void* buffer);
using HostUnmapFn = Status (*)(DeviceId device, const void* buffer);
using MemCopyAsyncFn = Status (*)(StreamHandle stream, uint64_t src, uint64_t size, uint64_t dst, int32_t direction);
using LaunchExtFn = Status (*)(StreamHandle stream, const LaunchTensorInfo* tensors, uint32_t num_tensors,
                               uint64_t workspace, RecipeHandle recipe, uint32_t flags);
using StatusGetBriefDescriptionFn = Status (*)(Status status, char* description, size_t length);
}

}  // namespace kiln::hpu::syn
