// Umbrella header for autograd_lite: tensors, ops, the engine, nn, optim, utils, the thread pool
// and file formats.
#pragma once

#include "loom/autograd/autocast.h"
#include "loom/autograd/engine.h"
#include "loom/autograd/grad_scaler.h"
#include "loom/autograd/nn.h"
#include "loom/autograd/npy.h"
#include "loom/autograd/ops.h"
#include "loom/autograd/optim.h"
#include "loom/autograd/parallel.h"
#include "loom/autograd/serialize.h"
#include "loom/autograd/tensor.h"
#include "loom/autograd/utils.h"
