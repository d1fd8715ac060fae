// Landmarks files (from-folder --landmarks): good lines in their variants, and each bad line an
// error naming its file and line.

#include "myriad/data/landmarks_file.h"

#include <gtest/gtest.h>

#include "support/test_files.h"

namespace myriad {
namespace {

using myriad::testing::error_of;
using myriad::testing::temp_file;
using myriad::testing::write_bytes;

// The error of reading a file of `text`, from its line number on ("" when it reads).
std::string error_reading(const std::string& text) {
  const std::string path = temp_file("landmarks.txt");
  write_bytes(path, text);
  const std::string error = error_of([&] { read_landmarks_file(path); });
  return error.empty() ? error : error.substr(error.find(path) + path.size() + 2);
}

TEST(LandmarksFile, ReadsLinesWithSpacesTabsAndCarriageReturns) {
  const std::string path = temp_file("good.txt");
  write_bytes(path,
              "alice/001.jpg 38.3 51.7 73.5 51.5 56.0 71.7 41.5 92.4 70.7 92.2\n"
              "\n"
              "  ./bob//002.png\t1e2 150 200 150 150 200 110 250 190 250\r\n"
              "carol/x.jpeg -5 -5 5 -5 0 0 -4 5 4 5");
  const std::vector<FaceLandmarks> faces = read_landmarks_file(path);
  ASSERT_EQ(faces.size(), 3u);
  EXPECT_EQ(faces[0].path, "alice/001.jpg");
  EXPECT_EQ(faces[0].line, 1);
  EXPECT_DOUBLE_EQ(faces[0].points[4].x, 70.7);
  EXPECT_DOUBLE_EQ(faces[0].points[4].y, 92.2);
  EXPECT_EQ(faces[1].path, "bob/002.png");
  EXPECT_EQ(faces[1].line, 3);
  EXPECT_DOUBLE_EQ(faces[1].points[0].x, 100.0);
  EXPECT_EQ(faces[2].path, "carol/x.jpeg");
  EXPECT_DOUBLE_EQ(faces[2].points[1].y, -5.0);
}

TEST(LandmarksFile, NamesTheLineOfEachProblem) {
  const std::string good = "a.jpg 38.3 51.7 73.5 51.5 56.0 71.7 41.5 92.4 70.7 92.2\n";
  EXPECT_EQ(error_reading(good + "b.jpg 1 2 3 4 5 6 7 8 9\n"),
            "line 2: 9 numbers after the image, 10 expected (PATH x1 y1 ... x5 y5, the left eye, "
            "right eye, nose, left and right mouth corners)");
  EXPECT_EQ(error_reading("b.jpg\n").substr(0, 18), "line 1: 0 numbers ");
  EXPECT_EQ(error_reading(good + good.substr(0, good.size() - 1) + " 7\n").substr(0, 19),
            "line 2: 11 numbers ");
  for (const std::string bad : {"nan", "inf", "-inf", "1e999", "12abc", "0x", "--1"}) {
    EXPECT_EQ(error_reading("b.jpg 1 2 3 4 " + bad + " 6 7 8 9 10\n"),
              "line 1: the coordinate '" + bad + "' is not a finite number")
        << bad;
  }
  EXPECT_NE(error_reading(good + "c.jpg 3 3 3 3 3 3 3 3 3 3\n")
                .find("line 2: the landmarks of 'c.jpg' give no alignment"),
            std::string::npos);
  EXPECT_EQ(error_reading(good + "\n./x/../" + good),
            "line 3: 'a.jpg' has landmarks already on line 1");
  EXPECT_FALSE(error_of([] { read_landmarks_file(temp_file("none.txt")); }).empty());
}

}  // namespace
}  // namespace myriad
