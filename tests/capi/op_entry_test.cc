// The C API's ops by name (kjit_op_*, ABI 6) on a compile-only runtime, through libkjit_c.so and
// its header only: the schema, a spec JSON over the defaults, the same op as the typed entry points
// make, named arguments checked by name and converted as the typed structs are, workspaces, queries
// and the handle's kind.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kjit/kjit_c.h"
#include "tests/capi/take_string.h"
#include "tests/temp_dir.h"

namespace kjit {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class CapiOpByName : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    kjit_runtime_options o;
    kjit_runtime_options_init(&o);
    o.target = "sm_90";
    o.compile_only = 1;
    o.cache_dir = tmp_.path().c_str();
    ASSERT_EQ(kjit_runtime_create(&o, &rt_), KJIT_OK) << kjit_last_error();
  }
  void TearDown() override {
    for (kjit_op* op : ops_) kjit_op_destroy(op);
    kjit_runtime_destroy(rt_);
  }
  // The op of `spec`, or nullptr with the status and message in status_ and message_.
  kjit_op* Create(const char* spec) {
    kjit_op* op = reinterpret_cast<kjit_op*>(this);  // cleared by a failed call
    status_ = kjit_op_create(rt_, spec, &op);
    message_ = kjit_last_error();
    if (op != nullptr) ops_.push_back(op);
    return op;
  }
  std::string Spec(const kjit_op* op) {
    char* text = nullptr;
    EXPECT_EQ(kjit_op_spec(op, &text), KJIT_OK) << kjit_last_error();
    return Take(text);
  }
  // A launch of `pass` with these named tensors; its status, the message in message_.
  kjit_status Launch(const kjit_op* op, const char* pass, std::vector<kjit_named_tensor> tensors,
                     void* workspace = nullptr, int64_t workspace_bytes = 0) {
    kjit_op_args args;
    kjit_op_args_init(&args);
    args.tensors = tensors.data();
    args.tensor_count = static_cast<int32_t>(tensors.size());
    args.workspace = workspace;
    args.workspace_bytes = workspace_bytes;
    const kjit_status s = kjit_op_launch(op, pass, nullptr, &args);
    message_ = kjit_last_error();
    return s;
  }

  testing::TempDir tmp_{"kjit_capi_op_test"};
  kjit_runtime* rt_ = nullptr;
  std::vector<kjit_op*> ops_;
  kjit_status status_ = KJIT_OK;
  std::string message_;
  std::vector<float> host_ = std::vector<float>(3 * 4096);
  kjit_tensor x_{host_.data(), KJIT_BF16, 3, 4096, 4096};
  kjit_tensor w_{host_.data() + 2 * 4096, KJIT_BF16, 1, 4096, 4096};
};

TEST_F(CapiOpByName, TheSchemaListsEachOpWithItsDefaultsAndPasses) {
  char* text = nullptr;
  ASSERT_EQ(kjit_op_schema(&text), KJIT_OK) << kjit_last_error();
  const nlohmann::json schema = nlohmann::json::parse(Take(text));
  EXPECT_EQ(schema["abi_version"], KJIT_C_ABI_VERSION);
  const nlohmann::json* norm = nullptr;
  std::vector<std::string> kinds;
  for (const nlohmann::json& op : schema["ops"]) {
    kinds.push_back(op["op"]);
    EXPECT_EQ(op["spec"]["op"], op["op"]) << op.dump();
    if (op["op"] == "rms_norm") norm = &op;
  }
  EXPECT_TRUE(std::is_sorted(kinds.begin(), kinds.end()));
  ASSERT_NE(norm, nullptr) << schema.dump();
  EXPECT_EQ((*norm)["spec"]["dtype"], "bf16");
  EXPECT_EQ((*norm)["config"], true);
  EXPECT_EQ((*norm)["config_for"], true);
  EXPECT_EQ((*norm)["passes"][0].dump(),
            R"({"indexes":[],"pass":"forward","tensors":["x","weight","y","rstd","residual",)"
            R"("residual_out"],"workspace":false})");
  EXPECT_EQ((*norm)["passes"][1]["pass"], "backward");
  EXPECT_EQ((*norm)["passes"][1]["workspace"], true);
}

TEST_F(CapiOpByName, MakesTheOpTheTypedEntryPointsMake) {
  kjit_op* op = Create(
      R"({"op": "rms_norm", "hidden": 4096, "eps": 1e-5, "config": "vec=8 fwd=256x1 bwd=512x1r2"})");
  ASSERT_NE(op, nullptr) << message_;
  const nlohmann::json spec = nlohmann::json::parse(Spec(op));
  EXPECT_EQ(spec["hidden"], 4096);
  EXPECT_FLOAT_EQ(spec["eps"].get<float>(), 1e-5f);
  EXPECT_EQ(spec["casting"], "llama");  // a default

  char* config = nullptr;
  ASSERT_EQ(kjit_op_config_for(op, 1024, &config), KJIT_OK) << kjit_last_error();
  EXPECT_EQ(Take(config), "vec=8 fwd=256x1 bwd=512x1r2");

  // The same build (cache key) as kjit_rms_norm_build's for the same spec and config.
  kjit_rms_norm_spec typed;
  kjit_rms_norm_spec_init(&typed);
  typed.hidden = 4096;
  typed.eps = 1e-5f;
  typed.config = "vec=8 fwd=256x1 bwd=512x1r2";
  kjit_rms_norm* norm = nullptr;
  ASSERT_EQ(kjit_rms_norm_create(rt_, &typed, &norm), KJIT_OK) << kjit_last_error();
  char* by_name = nullptr;
  char* by_type = nullptr;
  ASSERT_EQ(kjit_op_build(op, &by_name), KJIT_OK) << kjit_last_error();
  ASSERT_EQ(kjit_rms_norm_build(norm, &by_type), KJIT_OK) << kjit_last_error();
  EXPECT_EQ(nlohmann::json::parse(Take(by_name))["key"],
            nlohmann::json::parse(Take(by_type))["key"]);

  int64_t typed_bytes = 0, bytes = -1;
  ASSERT_EQ(kjit_rms_norm_backward_workspace_bytes(norm, 1000, &typed_bytes), KJIT_OK);
  ASSERT_EQ(kjit_op_workspace_bytes(op, "backward", 1000, &bytes), KJIT_OK) << kjit_last_error();
  EXPECT_EQ(bytes, typed_bytes);
  ASSERT_EQ(kjit_op_workspace_bytes(op, "forward", 1000, &bytes), KJIT_OK);
  EXPECT_EQ(bytes, 0);
  EXPECT_EQ(kjit_op_workspace_bytes(op, "sideways", 1000, &bytes), KJIT_INVALID_ARGUMENT);
  EXPECT_STREQ(kjit_last_error(),
               "pass: \"sideways\" is not a pass of rms_norm; it has \"forward\", \"backward\"");
  EXPECT_EQ(kjit_op_workspace_bytes(op, "backward", -1, &bytes), KJIT_INVALID_ARGUMENT);
  kjit_rms_norm_destroy(norm);
}

TEST_F(CapiOpByName, BadSpecsAreNamed) {
  const struct {
    const char* spec;
    const char* message;
  } cases[] = {
      {"not json", "spec_json: not valid JSON: not json"},
      {"[1]", "spec_json: expected a JSON object"},
      {R"({"hidden": 4096})", "op: is missing; expected the op's name as a string, one of "},
      {R"({"op": 7})", "op: 7 is not a string"},
      {R"({"op": "rms_nrom"})",
       "op: \"rms_nrom\" is not an op of kjit_op_create; expected one of "},
      {R"({"op": "rms_norm"})", "hidden: "},  // the default, 0, is refused by the op's checks
      {R"({"op": "rms_norm", "hidden": 4096, "hiden": 1})", "hiden: "},
      {R"({"op": "rms_norm", "hidden": 4096.5})", "hidden: 4096.5 is not an integer"},
      {R"({"op": "rms_norm", "hidden": 4096, "config": 8})", "config: 8 is not a string"},
      {R"({"op": "rms_norm", "hidden": 4096, "config": "vec=3"})", "config: "},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(Create(c.spec), nullptr) << c.spec;
    EXPECT_EQ(status_, KJIT_INVALID_ARGUMENT) << c.spec;
    EXPECT_THAT(message_, StartsWith(c.message)) << c.spec;
  }
  kjit_op* op = reinterpret_cast<kjit_op*>(this);
  EXPECT_EQ(kjit_op_create(rt_, nullptr, &op), KJIT_INVALID_ARGUMENT);
  EXPECT_EQ(op, nullptr);
  EXPECT_STREQ(kjit_last_error(), "kjit_op_create: spec_json is NULL");
}

TEST_F(CapiOpByName, LaunchesCheckTheNamesThenTheArgumentsThenRefuseCompileOnly) {
  kjit_op* op = Create(R"({"op": "rms_norm", "hidden": 4096})");
  ASSERT_NE(op, nullptr) << message_;
  kjit_tensor y = x_;
  EXPECT_EQ(Launch(op, "forward", {{"x", x_}, {"weight", w_}, {"y", y}}), KJIT_FAILED_PRECONDITION)
      << message_;
  EXPECT_THAT(message_, HasSubstr("compile-only"));

  EXPECT_EQ(Launch(op, "forward", {{"x", x_}, {"z", w_}}), KJIT_INVALID_ARGUMENT);
  EXPECT_EQ(
      message_,
      "tensors: \"z\" is not a tensor of the forward pass; it takes \"x\", \"weight\", \"y\", "
      "\"rstd\", \"residual\", \"residual_out\"");
  EXPECT_EQ(Launch(op, "forward", {{"x", x_}, {"x", x_}}), KJIT_INVALID_ARGUMENT);
  EXPECT_EQ(message_, "tensors[1].name: \"x\" is given twice");
  EXPECT_EQ(Launch(op, "forward", {{nullptr, x_}}), KJIT_INVALID_ARGUMENT);
  EXPECT_EQ(message_, "tensors[0].name is NULL");
  EXPECT_EQ(Launch(op, "fwd", {}), KJIT_INVALID_ARGUMENT);
  EXPECT_THAT(message_, StartsWith("pass: \"fwd\" is not a pass of rms_norm"));

  // Converted as the typed structs are: a dtype out of range is named by the argument's name.
  kjit_tensor bad = x_;
  bad.dtype = 9;
  EXPECT_EQ(Launch(op, "forward", {{"x", bad}, {"weight", w_}, {"y", y}}), KJIT_INVALID_ARGUMENT);
  EXPECT_THAT(message_, StartsWith("x.dtype: 9 is out of range"));
  // The op's own checks, as through kjit_rms_norm_forward.
  EXPECT_EQ(Launch(op, "forward", {{"x", x_}, {"y", y}}), KJIT_INVALID_ARGUMENT);
  EXPECT_THAT(message_, StartsWith("weight"));

  // A workspace for a pass that takes none.
  int workspace = 0;
  EXPECT_EQ(Launch(op, "forward", {{"x", x_}, {"weight", w_}, {"y", y}}, &workspace, 4),
            KJIT_INVALID_ARGUMENT);
  EXPECT_THAT(message_, StartsWith("workspace: the forward pass takes none"));

  kjit_op_args args;
  kjit_op_args_init(&args);
  EXPECT_EQ(args.struct_size, sizeof(kjit_op_args));
  args.tensor_count = 2;
  EXPECT_EQ(kjit_op_launch(op, "forward", nullptr, &args), KJIT_INVALID_ARGUMENT);
  EXPECT_STREQ(kjit_last_error(), "tensor_count: 2, but tensors is NULL");
  args.tensor_count = -1;
  EXPECT_EQ(kjit_op_launch(op, "forward", nullptr, &args), KJIT_INVALID_ARGUMENT);
  EXPECT_STREQ(kjit_last_error(), "tensor_count: -1 is negative");
  args.tensor_count = 0;
  args.struct_size = 8;
  EXPECT_EQ(kjit_op_launch(op, "forward", nullptr, &args), KJIT_INVALID_ARGUMENT);
  EXPECT_THAT(kjit_last_error(), HasSubstr("args->struct_size is 8"));
  EXPECT_EQ(kjit_op_launch(op, nullptr, nullptr, &args), KJIT_INVALID_ARGUMENT);
  EXPECT_STREQ(kjit_last_error(), "kjit_op_launch: pass is NULL");
}

TEST_F(CapiOpByName, AHandleOfAnotherKindIsRefusedBothWays) {
  kjit_op* op = Create(R"({"op": "rms_norm", "hidden": 4096})");
  ASSERT_NE(op, nullptr) << message_;
  char* text = nullptr;
  EXPECT_EQ(kjit_op_build(reinterpret_cast<const kjit_op*>(rt_), &text), KJIT_INVALID_ARGUMENT);
  EXPECT_STREQ(kjit_last_error(), "kjit_op_build: op is a kjit_runtime handle; expected a kjit_op");
  EXPECT_EQ(kjit_rms_norm_build(reinterpret_cast<const kjit_rms_norm*>(op), &text),
            KJIT_INVALID_ARGUMENT);
  EXPECT_STREQ(kjit_last_error(),
               "kjit_rms_norm_build: op is a kjit_op handle; expected a kjit_rms_norm");
  kjit_op_destroy(nullptr);
}

}  // namespace
}  // namespace kjit
