// The source whose compile command guide_code.py borrows for the guide's code: the preamble that
// every fragment of the guide is compiled after.
#include "guide_preamble.h"
