#pragma once
// Where tests find data that lives outside the repository: the shared reference outputs
// (../shared, or $TAILSERVE_SHARED_DIR) and the tokenizer files scripts/fetch-tokenizers.sh fetched.
#include <cstdlib>
#include <filesystem>
#include <string>

namespace tailserve::testing {

inline std::string SharedDir() {
  if (const char* env = std::getenv("TAILSERVE_SHARED_DIR"); env && *env) return env;
  return std::string(TAILSERVE_SOURCE_DIR) + "/../shared";
}

inline std::string ReferenceDir(const std::string& name) { return SharedDir() + "/reference/" + name; }

// The default model shipped in the repository (tools/lm), with its reference outputs in reference/.
inline std::string DefaultModelDir() {
  if (const char* env = std::getenv("TAILSERVE_DEFAULT_MODEL"); env && *env) return env;
  return std::string(TAILSERVE_SOURCE_DIR) + "/models/tiny-en";
}

// A reference checkpoint by name: "tiny-en" is the shipped default model, the others live in the
// shared reference data.
inline std::string CheckpointDir(const std::string& name) {
  return name == "tiny-en" ? DefaultModelDir() : ReferenceDir(name);
}

// Where transformers' outputs for that checkpoint are (expected.json, expected_logits.safetensors):
// beside the shared ones' weights, in reference/ for the shipped model.
inline std::string ExpectedDir(const std::string& name) {
  return name == "tiny-en" ? DefaultModelDir() + "/reference" : ReferenceDir(name);
}

// name: "llama3" or "qwen3".
inline std::string TokenizerDir(const std::string& name) {
  return std::string(TAILSERVE_SOURCE_DIR) + "/.deps/tokenizers/" + name;
}

}  // namespace tailserve::testing

// Skips the test, saying why, when the shared reference data is not present on this machine.
#define TAILSERVE_REQUIRE_SHARED()                                                                 \
  do {                                                                                             \
    if (!std::filesystem::exists(::tailserve::testing::SharedDir() + "/reference")) {              \
      GTEST_SKIP() << "shared reference data not found at " << ::tailserve::testing::SharedDir()  \
                   << " (set TAILSERVE_SHARED_DIR)";                                               \
    }                                                                                              \
  } while (0)

// Skips the test when the named reference checkpoint (CheckpointDir) is not on this machine: the
// shared ones may be absent; the shipped model is in the repository, so its absence fails.
#define TAILSERVE_REQUIRE_CHECKPOINT(name)                                                          \
  do {                                                                                             \
    if ((name) == std::string("tiny-en")) {                                                        \
      ASSERT_TRUE(std::filesystem::exists(::tailserve::testing::DefaultModelDir() + "/config.json")) \
          << "the shipped model is missing: " << ::tailserve::testing::DefaultModelDir();          \
    } else {                                                                                       \
      TAILSERVE_REQUIRE_SHARED();                                                                  \
    }                                                                                              \
  } while (0)
