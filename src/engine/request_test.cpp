#include "engine/request.h"

#include <gtest/gtest.h>

namespace nextn {
namespace {

TEST(BrokenDrafts, FewerThanOnePercentOfEnoughDraftsAccepted) {
  // too few drafts to tell, however bad
  EXPECT_EQ(broken_drafts_warning(0, 0), "");
  EXPECT_EQ(broken_drafts_warning(kBrokenDraftsMinTokens - 1, 0), "");
  // enough, none accepted: named, with the counts
  const std::string w = broken_drafts_warning(kBrokenDraftsMinTokens, 0);
  EXPECT_NE(w.find("warning: the MTP layers' drafts were accepted 0 of 64 times (0.0%)"), std::string::npos) << w;
  EXPECT_NE(w.find("--no-speculate"), std::string::npos) << w;
  EXPECT_EQ(w.find('\n'), std::string::npos) << w;
  // the 1% line: 9 of 1000 is broken, 10 of 1000 is a (poor) trained layer's
  EXPECT_NE(broken_drafts_warning(1000, 9), "");
  EXPECT_EQ(broken_drafts_warning(1000, 10), "");
  EXPECT_EQ(broken_drafts_warning(1000, 700), "");
}

}  // namespace
}  // namespace nextn
