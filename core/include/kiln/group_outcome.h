// What became of one group of nodes a backend claimed: whether the backend's code runs it or kiln's
// eager executor does, and why. A step whose every group fell back computes the right numbers
// without running any of the backend's code, so tools that judge a backend (`kiln conformance`,
// `kiln bench`) read these rather than the claims.
#pragma once

#include <cstddef>
#include <string>

namespace kiln {

struct GroupOutcome {
  std::string backend;    // the plugin that claimed the group
  size_t nodes = 0;       // nodes in the group
  std::string first_op;   // the group's first node's op, to name the group in a report
  bool compiled = false;  // the backend's executable runs it
  // The backend declined it (compile returned KILN_ERROR_UNIMPLEMENTED: "run these eagerly"), as
  // the ABI allows; any other error is a failure of the backend.
  bool declined = false;
  std::string reason;  // why it did not compile: the plugin's error code and message ("" when compiled)
  // Shapes that change (a backend with symbolic shapes, plugin ABI 2.4): the group was compiled
  // once for every size (at this shape), or is run by such an executable compiled at another shape
  // of the step, so that nothing was compiled for it here.
  bool every_size = false;
  bool reused = false;
};

}  // namespace kiln
