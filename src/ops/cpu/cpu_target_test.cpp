// NEXTN_CPU_TARGET: the name parser, the process-wide choice, ForceTarget giving it back, and programs
// started with a name they must refuse (exit status 2 and a message) or honour.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "ops/cpu/target_env.h"
#include "ops/cpu/target_testing.h"
#include "ops/cpu_target.h"
#include "ops/ops.h"

namespace nextn {
namespace {

constexpr int64_t kCompiled = HWY_AVX3 | HWY_AVX2 | HWY_EMU128;  // this build's targets, for the parser only
constexpr int64_t kAvx2Cpu = HWY_AVX2 | HWY_EMU128;              // what an AVX2-only CPU runs of them

TEST(CpuTarget, ParsesHighwayNamesAndAliasesInAnyCase) {
  EXPECT_EQ(cpu_target::parse("avx2", kCompiled, kAvx2Cpu).target, HWY_AVX2);
  EXPECT_EQ(cpu_target::parse("AVX2", kCompiled, kAvx2Cpu).target, HWY_AVX2);
  EXPECT_EQ(cpu_target::parse("Emu128", kCompiled, kAvx2Cpu).target, HWY_EMU128);
  EXPECT_EQ(cpu_target::parse("scalar", kCompiled, kAvx2Cpu).target, HWY_EMU128);
  EXPECT_EQ(cpu_target::parse("SCALAR", HWY_AVX2 | HWY_SCALAR, HWY_AVX2 | HWY_SCALAR).target, HWY_SCALAR);
  EXPECT_EQ(cpu_target::parse("avx512", kCompiled, kCompiled).target, HWY_AVX3);
  EXPECT_EQ(cpu_target::parse("avx3", kCompiled, kCompiled).target, HWY_AVX3);
  EXPECT_TRUE(cpu_target::parse("avx2", kCompiled, kAvx2Cpu).error.empty());
}

TEST(CpuTarget, RefusesWhatThisCpuCannotRun) {
  const cpu_target::Choice c = cpu_target::parse("avx512", kCompiled, kAvx2Cpu);
  EXPECT_EQ(c.target, 0);
  EXPECT_EQ(c.error, "NEXTN_CPU_TARGET=avx512: this CPU cannot run AVX3; it can run: AVX2, EMU128");
}

TEST(CpuTarget, RefusesWhatIsNotCompiledIn) {
  for (const char* name : {"avx3_dl", "SSE4", "avx3_zen4", "AVX10_2"}) {
    const cpu_target::Choice c = cpu_target::parse(name, kCompiled, kCompiled);
    EXPECT_EQ(c.target, 0) << name;
    EXPECT_NE(c.error.find("is not compiled into this build; it has: AVX3, AVX2, EMU128"), std::string::npos)
        << c.error;
    EXPECT_EQ(c.error.rfind(std::string("NEXTN_CPU_TARGET=") + name + ": ", 0), 0u) << c.error;
  }
  // "scalar" when no scalar target is compiled in.
  EXPECT_EQ(cpu_target::parse("scalar", HWY_AVX2, HWY_AVX2).error,
            "NEXTN_CPU_TARGET=scalar: SCALAR is not compiled into this build; it has: AVX2");
}

TEST(CpuTarget, RefusesUnknownNames) {
  for (const char* name : {"bogus", "avx", "avx2 ", "", "Unknown"}) {
    const cpu_target::Choice c = cpu_target::parse(name, kCompiled, kCompiled);
    EXPECT_EQ(c.target, 0) << name;
    EXPECT_EQ(c.error, std::string("NEXTN_CPU_TARGET=") + name +
                           ": unknown target; this build has: AVX3, AVX2, EMU128 (also: avx512, scalar)");
  }
}

TEST(CpuTarget, NamesBestFirst) {
  EXPECT_EQ(cpu_target::names(HWY_EMU128 | HWY_AVX2 | HWY_AVX3), "AVX3, AVX2, EMU128");
  EXPECT_EQ(cpu_target::names(HWY_AVX2), "AVX2");
  EXPECT_EQ(cpu_target::names(0), "none");
}

// The choice this process runs: NEXTN_CPU_TARGET's target when set, the best runnable one otherwise.
// (Also run by ChildProcessHonoursTheVariable under each runnable target.)
TEST(CpuTarget, ActiveTargetIsTheProcessChoice) {
  const int64_t runnable = cpu_target::runnable();
  ASSERT_NE(runnable & (HWY_EMU128 | HWY_SCALAR), 0) << cpu_target::names(runnable);  // the fallback always runs
  ASSERT_EQ(runnable & ~matmul_kernels::compiled_targets(), 0);
  const char* env = std::getenv("NEXTN_CPU_TARGET");
  const bool set = env != nullptr && *env != '\0';
  EXPECT_EQ(ops::cpu_target_forced(), set);
  std::vector<float> a(19, 0.5f), b(19, 2.0f), out(19);
  ops::mul_sigmoid(a.data(), b.data(), 19, out.data());  // a kernel call in between changes nothing
  if (set) {
    const cpu_target::Choice c = cpu_target::parse(env, matmul_kernels::compiled_targets(), runnable);
    ASSERT_NE(c.target, 0) << c.error;  // (the process would have exited otherwise)
    EXPECT_EQ(cpu_target::forced(), c.target);
    EXPECT_STREQ(ops::cpu_target_name(), hwy::TargetName(c.target));
  } else {
    EXPECT_EQ(cpu_target::forced(), 0);
    EXPECT_STREQ(ops::cpu_target_name(), hwy::TargetName(runnable & -runnable));
  }
}

TEST(CpuTarget, ForceTargetGivesBackTheProcessChoice) {
  const std::string before = ops::cpu_target_name();
  for (int64_t target : kernel_targets()) {
    {
      ForceTarget force(target);
      EXPECT_STREQ(ops::cpu_target_name(), hwy::TargetName(target));
    }
    EXPECT_EQ(ops::cpu_target_name(), before) << "after forcing " << hwy::TargetName(target);
  }
}

struct Child {
  int status;
  std::string err;
};

// Runs `<var>=<value> <command>` through the shell, stdout discarded.
Child run_with_env(const std::string& var, const std::string& value, const std::string& command) {
  const std::string cmd = var + "='" + value + "' " + command + " 2>&1 >/dev/null </dev/null";
  Child r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.err.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

Child run_with_target(const std::string& value, const std::string& command) {
  return run_with_env("NEXTN_CPU_TARGET", value, command);
}

const std::string kCli = std::string(NEXTN_CLI_PATH) + " --help";

TEST(CpuTarget, CliRefusesUnknownFp8DecodeWithStatus2) {
  const Child r = run_with_env("NEXTN_FP8_DECODE", "fast", kCli);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("nextn: NEXTN_FP8_DECODE=fast: unknown; use auto, f16 or bits"), std::string::npos) << r.err;
  for (const char* ok : {"auto", "F16", "bits"}) EXPECT_EQ(run_with_env("NEXTN_FP8_DECODE", ok, kCli).status, 0) << ok;
}

TEST(CpuTarget, CliRefusesUnknownTargetWithStatus2) {
  const Child r = run_with_target("bogus", kCli);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("nextn: NEXTN_CPU_TARGET=bogus: unknown target; this build has: "), std::string::npos) << r.err;
}

TEST(CpuTarget, CliRefusesTargetsThisCpuCannotRun) {
  const int64_t unrunnable = matmul_kernels::compiled_targets() & ~cpu_target::runnable();
  if (unrunnable == 0) GTEST_SKIP() << "this CPU runs every compiled target";
  const std::string name = hwy::TargetName(unrunnable & -unrunnable);
  const Child r = run_with_target(name, kCli);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("nextn: NEXTN_CPU_TARGET=" + name + ": this CPU cannot run " + name +
                       "; it can run: " + cpu_target::names(cpu_target::runnable())),
            std::string::npos)
      << r.err;
}

TEST(CpuTarget, CliAcceptsEveryRunnableTarget) {
  for (int64_t bits = cpu_target::runnable(); bits != 0; bits &= bits - 1) {
    std::string name = hwy::TargetName(bits & -bits);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const Child r = run_with_target(name, kCli);
    EXPECT_EQ(r.status, 0) << name << ": " << r.err;
  }
  EXPECT_EQ(run_with_target("scalar", kCli).status, 0);
}

// This test binary started again under each runnable target: its kernels run that one.
TEST(CpuTarget, ChildProcessHonoursTheVariable) {
  const std::string self = "/proc/" + std::to_string(getpid()) + "/exe";
  for (int64_t bits = cpu_target::runnable(); bits != 0; bits &= bits - 1) {
    const std::string name = hwy::TargetName(bits & -bits);
    const Child r = run_with_target(name, self + " --gtest_filter=CpuTarget.ActiveTargetIsTheProcessChoice");
    EXPECT_EQ(r.status, 0) << name << ": " << r.err;
  }
}

}  // namespace
}  // namespace nextn
