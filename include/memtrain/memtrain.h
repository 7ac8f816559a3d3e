// memtrain: everything a training program needs, in one include.
#pragma once

#include "memtrain/autograd/engine.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/autograd/node.h"
#include "memtrain/autograd/saved_tensor.h"
#include "memtrain/core/allocator.h"
#include "memtrain/core/device.h"
#include "memtrain/core/dtype.h"
#include "memtrain/core/error.h"
#include "memtrain/core/rng.h"
#include "memtrain/core/tensor.h"
#include "memtrain/cuda/cuda.h"
#include "memtrain/ops/elementwise.h"
#include "memtrain/ops/linalg.h"
#include "memtrain/ops/nn.h"
#include "memtrain/ops/reduce.h"
#include "memtrain/ops/shape.h"
