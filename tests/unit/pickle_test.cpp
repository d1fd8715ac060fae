// The restricted unpickler against pickles spelled out opcode by opcode as Python 2 and 3 write
// them (the e2e test feeds it Python's own pickles), and insightface .bin reading on top of it.

#include <gtest/gtest.h>

#include "myriad/data/pickle.h"
#include "myriad/data/verification_bin.h"
#include "support/test_files.h"

namespace myriad {
namespace {

using Kind = PickleValue::Kind;
using testing::error_of;

std::string u32(uint32_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 4);
}

// Python 2, protocol 2: pickle.dumps((['abc', <300 bytes>], [True, False]), 2).
std::string python2_bin(const std::string& big) {
  return std::string(
             "\x80\x02]q\x00(U\x03"
             "abcq\x01T",
             14) +
         u32(300) + big +
         std::string(
             "q\x02"
             "e]q\x03(\x88\x89"
             "e\x86q\x04.",
             14);
}

TEST(Unpickle, Python2Protocol2Strings) {
  const std::string big = testing::random_bytes(300, 3);
  const Pickle p = unpickle(python2_bin(big), "test");
  const PickleValue* v = &p.root();
  ASSERT_EQ(v->kind, Kind::kTuple);
  ASSERT_EQ(v->items.size(), 2u);
  const auto& images = v->items[0];
  ASSERT_EQ(images->kind, Kind::kList);
  ASSERT_EQ(images->items.size(), 2u);
  EXPECT_EQ(images->items[0]->bytes, "abc");
  EXPECT_EQ(images->items[1]->bytes, big);
  EXPECT_EQ(images->items[1]->kind, Kind::kBytes);
  const auto& flags = v->items[1];
  ASSERT_EQ(flags->items.size(), 2u);
  EXPECT_TRUE(flags->items[0]->boolean);
  EXPECT_FALSE(flags->items[1]->boolean);
}

TEST(Unpickle, Protocol0TextIntegersAndBools) {
  // pickle.dumps([True, False, 7, -12], 0) in Python 2.
  const Pickle p = unpickle("(lp0\nI01\naI00\naI7\naI-12\na.", "test");
  const PickleValue* v = &p.root();
  ASSERT_EQ(v->kind, Kind::kList);
  ASSERT_EQ(v->items.size(), 4u);
  EXPECT_EQ(v->items[0]->kind, Kind::kBool);
  EXPECT_TRUE(v->items[0]->boolean);
  EXPECT_FALSE(v->items[1]->boolean);
  EXPECT_EQ(v->items[2]->integer, 7);
  EXPECT_EQ(v->items[3]->integer, -12);
}

TEST(Unpickle, Python3Protocol4WithFramesMemoAndIntegers) {
  // Protocol 4: FRAME, MEMOIZE, SHORT_BINBYTES, SHORT_BINUNICODE, BINGET of a memoised list,
  // BININT1/BININT2/BININT/LONG1 integers.
  const std::string body = std::string(
                               "\x95\x00\x00\x00\x00\x00\x00\x00\x00"  // FRAME (length unchecked)
                               "]\x94(C\x02xy\x94\x8c\x03h\xc3\xa9\x94K\x07M\x01\x01",
                               28) +
                           "J" + u32(static_cast<uint32_t>(-5)) +
                           std::string(
                               "\x8a\x02\x00\xff"
                               "eh\x00\x86\x94.",
                               10);
  const Pickle p = unpickle("\x80\x04" + body, "test");
  const PickleValue* v = &p.root();
  ASSERT_EQ(v->kind, Kind::kTuple);
  const auto& list = v->items[0];
  ASSERT_EQ(list->items.size(), 6u);
  EXPECT_EQ(list->items[0]->bytes, "xy");
  EXPECT_EQ(list->items[1]->kind, Kind::kString);
  EXPECT_EQ(list->items[1]->bytes, "h\xc3\xa9");
  EXPECT_EQ(list->items[2]->integer, 7);
  EXPECT_EQ(list->items[3]->integer, 257);
  EXPECT_EQ(list->items[4]->integer, -5);
  EXPECT_EQ(list->items[5]->integer, -256);
  // The memo holds the list itself, not a copy.
  EXPECT_EQ(v->items[1], list);
}

TEST(Unpickle, Python3Protocol2BytesAreDecodedNotCalled) {
  // pickle.dumps(b'\xff\x00a', 2): _codecs.encode('\xff\x00a', 'latin1').
  const std::string p = std::string(
                            "\x80\x02"
                            "c_codecs\nencode\nq\x00X",
                            21) +
                        u32(4) +
                        std::string(
                            "\xc3\xbf\x00"
                            "aq\x01X",
                            7) +
                        u32(6) + std::string("latin1q\x02\x86q\x03Rq\x04.", 15);
  // Refused unless the reader allows _codecs.encode; then a call, as data, that pickled_bytes
  // decodes.
  EXPECT_NE(error_of([&] { unpickle(p, "test"); }).find("imports _codecs.encode"),
            std::string::npos);
  const Pickle pickle = unpickle(p, "test", allow_codecs_encode);
  EXPECT_TRUE(pickle.root().is_call_of("_codecs.encode"));
  EXPECT_EQ(pickled_bytes(pickle.root()), std::string("\xff\x00"
                                                      "a",
                                                      3));
}

TEST(Unpickle, RefusesCodeAndReportsDamage) {
  // A NumPy array: imports numpy.core.multiarray._reconstruct.
  EXPECT_NE(error_of([] {
              unpickle(
                  "\x80\x02"
                  "cnumpy.core.multiarray\n_reconstruct\nq\x00.",
                  "x.bin");
            }).find("x.bin imports numpy.core.multiarray._reconstruct at byte 2"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              unpickle(
                  "\x80\x02"
                  "cos\nsystem\n.",
                  "x.bin", allow_codecs_encode);
            }).find("runs no code"),
            std::string::npos);
  const std::string whole = python2_bin(std::string(300, 'z'));
  EXPECT_NE(error_of([&] { unpickle(whole.substr(0, 100), "x.bin"); }).find("x.bin is truncated"),
            std::string::npos);
  // NEWOBJ builds an object.
  EXPECT_NE(
      error_of([] { unpickle("\x80\x02)\x81.", "x.bin"); }).find("unsupported pickle opcode 0x81"),
      std::string::npos);
  EXPECT_NE(error_of([] { unpickle("a", "x.bin"); }).find("x.bin is malformed"), std::string::npos);
}

TEST(Unpickle, DictsCallsStateAndPersistentIdsAreData) {
  // collections.OrderedDict() with one item set, then BUILD with {'v': 1.5}; a persistent id
  // ('storage', '0') as a value; a protocol-0 dict.
  const auto allow = [](const std::string& module, const std::string& name) {
    return module == "collections" && name == "OrderedDict";
  };
  const std::string p = std::string(
                            "\x80\x02"
                            "ccollections\nOrderedDict\n)R(X") +
                        u32(1) + "aX" + u32(7) + "storageX" + u32(1) + "0" +
                        std::string("\x86Qu}X", 5) + u32(1) + "vG" +
                        std::string("\x3f\xf8\x00\x00\x00\x00\x00\x00", 8) + "sb.";
  const Pickle pickle = unpickle(p, "sd", allow);
  const PickleValue& root = pickle.root();
  ASSERT_TRUE(root.is_call_of("collections.OrderedDict"));
  EXPECT_TRUE(root.items.empty());
  ASSERT_EQ(root.set_items.size(), 2u);
  EXPECT_EQ(root.set_items[0]->bytes, "a");
  ASSERT_EQ(root.set_items[1]->kind, Kind::kPersistentId);
  EXPECT_EQ(root.set_items[1]->items[0]->items[0]->bytes, "storage");
  ASSERT_NE(root.state, nullptr);
  ASSERT_NE(root.state->find("v"), nullptr);
  EXPECT_EQ(root.state->find("v")->number, 1.5);
  EXPECT_EQ(root.state->find("w"), nullptr);
  const Pickle text = unpickle("(dp0\nVk\np1\nI3\ns.", "t");
  ASSERT_EQ(text.root().kind, Kind::kDict);
  EXPECT_EQ(text.root().find("k")->integer, 3);
}

TEST(Unpickle, RefusesCyclesDeepNestingAndMalformedGlobals) {
  // l = []; l.append(l): the memo hands the list back to itself.
  EXPECT_NE(error_of([] {
              unpickle(std::string("\x80\x02]q\x00h\x00"
                                   "a.",
                                   9),
                       "c");
            }).find("a list contains itself"),
            std::string::npos);
  // Shared, but not cyclic: [x, x] is fine.
  const Pickle shared = unpickle(std::string("\x80\x02]q\x00h\x00h\x00\x86.", 11), "c");
  EXPECT_EQ(shared.root().items[0], shared.root().items[1]);
  EXPECT_NE(error_of([] {
              unpickle("\x80\x02" + std::string(5000, ']') + std::string(4999, 'a') + ".", "d");
            }).find("nested more than 1000 deep"),
            std::string::npos);
  // STACK_GLOBAL of a list and an int (a fuzzer found it dereferencing a null module).
  EXPECT_NE(error_of([] { unpickle("\x80\x04]K\x01\x93.", "g"); }).find("needs two strings"),
            std::string::npos);
  EXPECT_NE(error_of([] { unpickle("\x80\x02K\x01)R.", "g"); }).find("a call of a int"),
            std::string::npos);
}

TEST(VerificationBin, ReadsImagesAndPairFlags) {
  const std::string path = testing::temp_file("pairs.bin");
  // Two images, one pair: (['abc', 300 bytes], [True, False]) has 2 flags for 1 pair.
  testing::write_bytes(path, python2_bin(std::string(300, 'q')));
  EXPECT_NE(error_of([&] { read_verification_bin(path); }).find("2 images for 2 pairs"),
            std::string::npos);
  // ([b'a', b'b', b'c', b'd'], [1, False]) in protocol 4 spelling: ints are accepted as flags.
  testing::write_bytes(path, std::string("\x80\x04](C\x01"
                                         "aC\x01"
                                         "bC\x01"
                                         "cC\x01"
                                         "de](K\x01\x89"
                                         "e\x86.",
                                         25));
  const VerificationBin bin = read_verification_bin(path);
  EXPECT_EQ(bin.images, (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(bin.issame, (std::vector<uint8_t>{1, 0}));
  testing::write_bytes(path, "(lp0\nI01\na.");
  EXPECT_NE(
      error_of([&] { read_verification_bin(path); }).find("is not an insightface verification set"),
      std::string::npos);
}

}  // namespace
}  // namespace myriad
