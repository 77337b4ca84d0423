// jit::Printable and jit::Quoted (issue 45, defects 11 and 12): what reaches a terminal or a
// message from outside kjit has no raw control character, NUL or invalid UTF-8, and a value echoed
// in a message is quoted and cut.
#include "jit/printable.h"

#include <string>

#include <gtest/gtest.h>

namespace kjit::jit {
namespace {

TEST(Printable, EscapesControlCharactersAndInvalidUtf8) {
  EXPECT_EQ(Printable("llama-3 caf\xc3\xa9 \xe2\x9c\x93"), "llama-3 caf\xc3\xa9 \xe2\x9c\x93");
  EXPECT_EQ(Printable("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(Printable(std::string("x\0y", 3)), "x\\x00y");
  EXPECT_EQ(Printable("1\n2\t3\r\x7f"), "1\\n2\\t3\\r\\x7f");
  EXPECT_EQ(Printable("\xc2\x9b"
                      "31m"),
            "\\u009b31m");  // C1 CSI as UTF-8
  EXPECT_EQ(Printable("/tmp/caf\xe9"), "/tmp/caf\\xe9");
  EXPECT_EQ(Printable("\xed\xa0\x80 \xc0\xaf \xf4\x90\x80\x80"),
            "\\xed\\xa0\\x80 \\xc0\\xaf \\xf4\\x90\\x80\\x80");
  EXPECT_EQ(Printable("a \"b\" \\c"), "a \"b\" \\c");
}

TEST(Printable, PrintableLinesKeepsLineBreaks) {
  EXPECT_EQ(PrintableLines("no NVRTC: \x1b[2J\nfix: set X\n"), "no NVRTC: \\x1b[2J\nfix: set X\n");
  EXPECT_EQ(PrintableLines(""), "");
  EXPECT_EQ(PrintableLines("\n\t"), "\n\\t");
}

TEST(Printable, QuotedEscapesQuotesAndCutsLongValues) {
  EXPECT_EQ(Quoted("mean"), "\"mean\"");
  EXPECT_EQ(Quoted(std::string("mean\0x", 6)), "\"mean\\x00x\"");
  EXPECT_EQ(Quoted("a\"b\\"), "\"a\\\"b\\\\\"");
  EXPECT_EQ(Quoted(std::string(100000, 'm'), 8), "\"mmmmmmmm...\" (100000 bytes)");
  // Never cut inside a UTF-8 sequence.
  EXPECT_EQ(Quoted("ab\xc3\xa9\xc3\xa9", 3), "\"ab...\" (6 bytes)");
}

}  // namespace
}  // namespace kjit::jit
