// What the CUDA tests share: a test without a usable device reports itself skipped, saying why.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "ops/cuda/cuda_ops.h"

#define NEXTN_SKIP_WITHOUT_CUDA()                                          \
  do {                                                                     \
    std::string why_no_cuda;                                               \
    if (!::nextn::cuda::available(&why_no_cuda)) GTEST_SKIP() << "CUDA: " << why_no_cuda; \
  } while (0)
