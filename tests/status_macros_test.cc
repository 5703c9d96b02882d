#include "common/status_macros.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tailserve {
namespace {

absl::Status Check(bool ok, int* calls) {
  ++*calls;
  return ok ? absl::OkStatus() : absl::FailedPreconditionError("check failed");
}

absl::StatusOr<int> Num(bool ok, int value, int* calls) {
  ++*calls;
  if (!ok) return absl::NotFoundError("no number");
  return value;
}

absl::StatusOr<std::unique_ptr<int>> Boxed(bool ok, int value) {
  if (!ok) return absl::ResourceExhaustedError("no box");
  return std::make_unique<int>(value);
}

// RETURN_IF_ERROR in a Status-returning function; `after` records whether the code after it ran.
absl::Status TwoChecks(bool first, bool second, int* calls, bool* after) {
  TAILSERVE_RETURN_IF_ERROR(Check(first, calls));
  TAILSERVE_RETURN_IF_ERROR(Check(second, calls));
  *after = true;
  return absl::OkStatus();
}

// ASSIGN_OR_RETURN into a declaration and into an existing variable, in a Status-returning function.
absl::Status Sum(bool first, bool second, int* calls, int* out) {
  TAILSERVE_ASSIGN_OR_RETURN(auto a, Num(first, 2, calls));
  int b = 0;
  TAILSERVE_ASSIGN_OR_RETURN(b, Num(second, 3, calls));
  *out = a + b;
  return absl::OkStatus();
}

// Both macros in a StatusOr-returning function, twice on one line (the temporaries stay distinct).
absl::StatusOr<std::string> Describe(bool check, bool number, int* calls) {
  TAILSERVE_RETURN_IF_ERROR(Check(check, calls));
  TAILSERVE_ASSIGN_OR_RETURN(int x, Num(number, 7, calls)); TAILSERVE_ASSIGN_OR_RETURN(int y, Num(true, 1, calls));
  return std::to_string(x + y);
}

// A move-only value, declared with its type (a converting move from the StatusOr's value).
absl::StatusOr<int> Unbox(bool ok) {
  TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<const int> p, Boxed(ok, 41));
  return *p + 1;
}

TEST(StatusMacrosTest, ReturnIfErrorOkPathRunsOn) {
  int calls = 0;
  bool after = false;
  EXPECT_TRUE(TwoChecks(true, true, &calls, &after).ok());
  EXPECT_TRUE(after);
  EXPECT_EQ(calls, 2);  // each expression evaluated exactly once
}

TEST(StatusMacrosTest, ReturnIfErrorReturnsTheSameStatus) {
  int calls = 0;
  bool after = false;
  const absl::Status s = TwoChecks(true, false, &calls, &after);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "check failed");
  EXPECT_FALSE(after);
  EXPECT_EQ(calls, 2);

  calls = 0;
  EXPECT_EQ(TwoChecks(false, true, &calls, &after), absl::FailedPreconditionError("check failed"));
  EXPECT_EQ(calls, 1);  // stopped at the first error
  EXPECT_FALSE(after);
}

TEST(StatusMacrosTest, AssignOrReturnOkPathAssignsDeclarationAndExistingVariable) {
  int calls = 0;
  int out = 0;
  ASSERT_TRUE(Sum(true, true, &calls, &out).ok());
  EXPECT_EQ(out, 5);
  EXPECT_EQ(calls, 2);  // each expression evaluated exactly once
}

TEST(StatusMacrosTest, AssignOrReturnReturnsTheSameStatus) {
  int calls = 0;
  int out = -1;
  const absl::Status s = Sum(true, false, &calls, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "no number");
  EXPECT_EQ(out, -1);
  EXPECT_EQ(calls, 2);

  calls = 0;
  EXPECT_EQ(Sum(false, true, &calls, &out), absl::NotFoundError("no number"));
  EXPECT_EQ(calls, 1);
}

TEST(StatusMacrosTest, MoveOnlyValue) {
  const absl::StatusOr<int> ok = Unbox(true);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, 42);
  EXPECT_EQ(Unbox(false).status(), absl::ResourceExhaustedError("no box"));
}

TEST(StatusMacrosTest, StatusOrReturningFunction) {
  int calls = 0;
  const absl::StatusOr<std::string> ok = Describe(true, true, &calls);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "8");
  EXPECT_EQ(calls, 3);

  calls = 0;
  EXPECT_EQ(Describe(false, true, &calls).status(), absl::FailedPreconditionError("check failed"));
  EXPECT_EQ(calls, 1);
  calls = 0;
  EXPECT_EQ(Describe(true, false, &calls).status(), absl::NotFoundError("no number"));
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace tailserve
