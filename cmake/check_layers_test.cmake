# ctest layers.rejects: cmake/check_layers.cmake on a small tree that breaks its rule in each way it knows, run
# as the build step runs it. It must fail and name each file:line and edge, and nothing else: includes from tests,
# of headers outside src/, within a layer or down the layers, and of families by files directly in src/models
# are allowed.
#   cmake -DNEXTN_LAYER_WORK=<scratch folder> -P cmake/check_layers_test.cmake
cmake_policy(VERSION 3.22)
if(NOT NEXTN_LAYER_WORK)
  message(FATAL_ERROR "usage: cmake -DNEXTN_LAYER_WORK=<scratch folder> -P check_layers_test.cmake")
endif()
set(tree ${NEXTN_LAYER_WORK}/src)
file(REMOVE_RECURSE ${NEXTN_LAYER_WORK})

function(source path text)
  file(WRITE ${tree}/${path} "${text}")
endfunction()
source(core/dtype.h "// the wrong way on line 6\n#include \"core/error.h\"\n#include \"hwy/highway.h\"\n#include <vector>\nint a[2]; // ; [\n  #  include \"engine/sampler.h\"\n")
source(core/error.h "")
source(core/dtype_test.cpp "#include \"engine/sampler.h\"\n")
source(engine/sampler.h "#include \"models/model.h\"\n#include \"core/dtype.h\"\n#include \"sampler_impl.h\"\n")
source(models/model.h "#include \"models/fam_a/a.h\"\n")
source(models/common/shared.h "#include \"models/model.h\"\n#include \"models/fam_a/a.h\"\n")
source(models/fam_a/a.h "#include \"models/common/shared.h\"\n#include \"models/fam_b/b.h\"\n#include \"models/fam_a/a.h\"\n")
source(models/fam_b/b.h "#include \"../fam_a/a.h\"\n")
source(stray/x.h "")

execute_process(COMMAND ${CMAKE_COMMAND} -DNEXTN_LAYER_SRC=${tree} -P ${CMAKE_CURRENT_LIST_DIR}/check_layers.cmake
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "the checker accepted a tree with forbidden includes:\n${out}")
endif()
foreach(expected
    "src/core/dtype.h:6: #include \"engine/sampler.h\": layer core must not include layer engine (core -> engine)"
    "src/models/common/shared.h:2: #include \"models/fam_a/a.h\": src/models/common must not include a model family (common -> fam_a)"
    "src/models/fam_a/a.h:2: #include \"models/fam_b/b.h\": model family fam_a must not include family fam_b (fam_a -> fam_b)"
    "src/models/fam_b/b.h:1: #include \"../fam_a/a.h\": model family fam_b must not include family fam_a (fam_b -> fam_a)"
    "src/stray/x.h: not in a layer"
    "include layering: 5 violation(s)")
  string(FIND "${out}" "${expected}" at)
  if(at LESS 0)
    message(FATAL_ERROR "the checker's output lacks: ${expected}\n--- its output:\n${out}")
  endif()
endforeach()
message(STATUS "check_layers.cmake rejects each kind of forbidden include, and only those")
