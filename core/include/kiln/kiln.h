// kiln's public C++ API: include this one header.
#pragma once

#include "kiln/compile.h"
#include "kiln/config.h"
#include "kiln/memory.h"
#include "kiln/precision.h"
#include "kiln/trainer.h"
#include "kiln/version.h"
