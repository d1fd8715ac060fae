#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <unordered_set>

#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/ijb_conversion.h"
#include "myriad/data/ijb_layout.h"
#include "myriad/data/synthetic_ijb.h"
#include "myriad/util/error.h"
#include "support/test_files.h"

namespace myriad {
namespace {

using testing::error_of;
using testing::temp_file;
using testing::write_bytes;

constexpr int64_t kFaceBytes = int64_t{kAlignedSide} * kAlignedSide * 3;

TEST(IjbLayout, ParsesTheThreeFiles) {
  // CRLF, tabs, blank lines and a last line without its newline are all accepted.
  const IjbFaces faces =
      parse_ijb_faces("1.jpg 1 69544\r\n\n2.jpg\t1  69545\n  \n10.jpg 7 -3", "faces.txt");
  EXPECT_EQ(faces.images, (std::vector<std::string>{"1.jpg", "2.jpg", "10.jpg"}));
  EXPECT_EQ(faces.templates, (std::vector<int64_t>{1, 1, 7}));
  EXPECT_EQ(faces.medias, (std::vector<int64_t>{69544, 69545, -3}));
  EXPECT_EQ(faces.lines, (std::vector<int64_t>{1, 3, 5}));

  const IjbLandmarks marks = parse_ijb_landmarks(
      "1.jpg 46.06 62.026 87.785 60.323 68.851 77.656 52.162 99.875 86.45 98.648 0.99887\n"
      "2.jpg 1 2 3 4 5 6 7 8 9 1e1 1\n",
      "marks.txt");
  ASSERT_EQ(marks.points.size(), 2u);
  EXPECT_EQ(marks.images[1], "2.jpg");
  EXPECT_DOUBLE_EQ(marks.points[0][0].x, 46.06);
  EXPECT_DOUBLE_EQ(marks.points[0][4].y, 98.648);
  EXPECT_DOUBLE_EQ(marks.points[1][2].x, 5.0);
  EXPECT_DOUBLE_EQ(marks.points[1][4].y, 10.0);
  EXPECT_FLOAT_EQ(marks.scores[0], 0.99887f);
  EXPECT_EQ(marks.lines, (std::vector<int64_t>{1, 2}));

  const IjbPairs pairs = parse_ijb_pairs("1 7 1\n7 1 0\n", "pairs.txt", {1, 7});
  EXPECT_EQ(pairs.templates, (std::vector<int64_t>{1, 7, 7, 1}));
  EXPECT_EQ(pairs.labels, (std::vector<uint8_t>{1, 0}));
}

TEST(IjbLayout, BadLinesNameTheFileAndLine) {
  const auto faces = [](const std::string& text) {
    return error_of([&] { parse_ijb_faces(text, "faces.txt"); });
  };
  EXPECT_EQ(faces("1.jpg 1 2\n2.jpg 1\n"),
            "'faces.txt' line 2: expected 3 fields (IMAGE TEMPLATE MEDIA), found 2");
  EXPECT_EQ(faces("1.jpg 1 2 3\n"),
            "'faces.txt' line 1: expected 3 fields (IMAGE TEMPLATE MEDIA), found 4");
  EXPECT_EQ(faces("1.jpg x1 2\n"), "'faces.txt' line 1: template id 'x1' is not an integer");
  EXPECT_EQ(faces("1.jpg 1 2.5\n"), "'faces.txt' line 1: media id '2.5' is not an integer");
  EXPECT_EQ(faces("1.jpg 99999999999999999999 2\n"),
            "'faces.txt' line 1: template id '99999999999999999999' is not an integer");

  const auto marks = [](const std::string& text) {
    return error_of([&] { parse_ijb_landmarks(text, "marks.txt"); });
  };
  const std::string good = "a.jpg 1 2 3 4 5 6 7 8 9 10 0.9\n";
  EXPECT_EQ(marks(good + "b.jpg 1 2 3 4 5 6 7 8 9 0.9\n"),
            "'marks.txt' line 2: expected 12 fields (IMAGE x1 y1 x2 y2 x3 y3 x4 y4 x5 y5 SCORE), "
            "found 11");
  EXPECT_EQ(marks("b.jpg 1 2 3 4 nan 6 7 8 9 10 0.9\n"),
            "'marks.txt' line 1: coordinate x3 'nan' is not a finite number");
  EXPECT_EQ(marks("b.jpg 1 2 3 4 5 6 7 8 9 -inf 0.9\n"),
            "'marks.txt' line 1: coordinate y5 '-inf' is not a finite number");
  EXPECT_EQ(marks(good + good + "b.jpg 1 2 3 4 5 6 7 8 9 10 inf\n"),
            "'marks.txt' line 3: the detector score 'inf' is not a finite number");
  EXPECT_EQ(marks("b.jpg 1 2 3 4 5 6 7 8 9 10 1e999\n"),
            "'marks.txt' line 1: the detector score '1e999' is not a finite number");
  EXPECT_EQ(marks("b.jpg 1 2 3 4 5 6 7 8 9 10 0.9x\n"),
            "'marks.txt' line 1: the detector score '0.9x' is not a finite number");

  const auto pairs = [](const std::string& text) {
    return error_of([&] { parse_ijb_pairs(text, "pairs.txt", {1, 2}); });
  };
  EXPECT_EQ(pairs("1 2 1\n1 2 2\n"), "'pairs.txt' line 2: pair label '2' is not 0 or 1");
  EXPECT_EQ(pairs("1 2 01\n"), "'pairs.txt' line 1: pair label '01' is not 0 or 1");
  EXPECT_EQ(pairs("1 3 0\n"),
            "'pairs.txt' line 1: template 3 has no image in the face/template file");
  EXPECT_EQ(pairs("1 2\n"),
            "'pairs.txt' line 1: expected 3 fields (TEMPLATE1 TEMPLATE2 LABEL), found 2");
  // A long corrupt field is cut short in the message.
  EXPECT_EQ(pairs(std::string(100, '7') + " 2 0\n"),
            "'pairs.txt' line 1: template id '" + std::string(40, '7') + "...' is not an integer");
}

// A layout under `root` from the three texts.
IjbLayout write_layout(const std::string& root, const std::string& faces,
                       const std::string& landmarks, const std::string& pairs) {
  std::filesystem::create_directories(root + "/meta");
  std::filesystem::create_directories(root + "/loose_crop");
  const IjbLayout layout = ijb_layout(root, IjbTarget::kIjbb);
  write_bytes(layout.faces, faces);
  write_bytes(layout.landmarks, landmarks);
  write_bytes(layout.pairs, pairs);
  return layout;
}

TEST(IjbLayout, TheFilesMustAgree) {
  const std::string root = temp_file("ijb-agree");
  const std::string faces = "1.jpg 5 1\n2.jpg 6 2\n";
  const std::string marks = "1.jpg 1 2 3 4 5 6 7 8 9 10 0.9\n2.jpg 1 2 3 4 5 6 7 8 9 10 0.8\n";
  IjbLayout layout = write_layout(root, faces, marks, "5 6 0\n5 5 1\n");
  EXPECT_EQ(layout.faces, root + "/meta/ijbb_face_tid_mid.txt");
  const IjbMeta meta = read_ijb_meta(layout);
  EXPECT_EQ(meta.pairs.templates, (std::vector<int64_t>{5, 6, 5, 5}));
  EXPECT_FLOAT_EQ(meta.landmarks.scores[1], 0.8f);

  write_layout(root, faces, "1.jpg 1 2 3 4 5 6 7 8 9 10 0.9\n3.jpg 1 2 3 4 5 6 7 8 9 10 0.8\n",
               "5 6 0\n");
  EXPECT_EQ(error_of([&] { read_ijb_meta(layout); }),
            "'" + layout.landmarks + "' line 2 names image '3.jpg' where '" + layout.faces +
                "' line 2 names '2.jpg': both must list the same images in the same order");
  write_layout(root, faces, "1.jpg 1 2 3 4 5 6 7 8 9 10 0.9\n", "5 6 0\n");
  EXPECT_EQ(error_of([&] { read_ijb_meta(layout); }),
            "'" + layout.faces + "' lists 2 images but '" + layout.landmarks +
                "' lists 1: both must list the same images in the same order");
  write_layout(root, faces, marks, "5 6 0\n6 8 0\n");
  EXPECT_EQ(error_of([&] { read_ijb_meta(layout); }),
            "'" + layout.pairs + "' line 2: template 8 has no image in the face/template file");
  write_layout(root, faces, marks, "\n");
  EXPECT_EQ(error_of([&] { read_ijb_meta(layout); }),
            "'" + layout.pairs + "' lists no template pairs");

  std::filesystem::remove(layout.landmarks);
  EXPECT_EQ(error_of([&] { read_ijb_meta(layout); }),
            "'" + layout.landmarks +
                "' does not exist: from-ijb reads insightface's IJB layout (ROOT/meta/ and "
                "ROOT/loose_crop/, docs/data-format.md)");
  write_layout(root, faces, marks, "5 6 0\n");
  std::filesystem::remove(layout.loose_crop);
  EXPECT_NE(
      error_of([&] { read_ijb_meta(layout); }).find("'" + layout.loose_crop + "' does not exist"),
      std::string::npos);
}

TEST(IjbLayout, TargetsAreIjbcAndIjbb) {
  EXPECT_EQ(parse_ijb_target("IJBC"), IjbTarget::kIjbc);
  EXPECT_EQ(parse_ijb_target("ijbb"), IjbTarget::kIjbb);
  EXPECT_EQ(ijb_target_name(IjbTarget::kIjbb), "IJBB");
  EXPECT_THROW(parse_ijb_target("IJBA"), UsageError);
  EXPECT_EQ(ijb_layout("r", IjbTarget::kIjbc).pairs, "r/meta/ijbc_template_pair_label.txt");
}

SyntheticIjbOptions small_set(double noise) {
  SyntheticIjbOptions o;
  o.identities = 3;
  o.templates = 7;
  o.images = 30;
  o.pairs = 200;
  o.genuine_fraction = 0.25;
  o.noise = noise;
  o.seed = 5;
  o.workers = 2;
  return o;
}

TEST(SyntheticIjb, TemplatesMediasAndPairsHaveTheirStructure) {
  const SyntheticIjb set(small_set(8.0));
  const SyntheticIjbOptions& o = set.options();
  std::set<int64_t> template_ids;
  std::map<int64_t, int64_t> media_template;  // media id -> its template
  int64_t videos = 0;
  for (int64_t i = 0; i < o.images; ++i) {
    const int64_t t = set.template_of(i);
    ASSERT_TRUE(t >= 0 && t < o.templates);
    if (i > 0) {
      EXPECT_GE(t, set.template_of(i - 1)) << "images are grouped by template";
    }
    template_ids.insert(set.template_id(t));
    const auto [it, fresh] = media_template.emplace(set.media_id(i), t);
    EXPECT_EQ(it->second, t) << "a media belongs to one template";
    videos += fresh ? 0 : 1;
  }
  EXPECT_EQ(static_cast<int64_t>(template_ids.size()), o.templates) << "every template has images";
  EXPECT_GT(videos, 0) << "some medias are videos of several frames";
  EXPECT_LT(static_cast<int64_t>(media_template.size()), o.images);

  int64_t genuine = 0;
  for (int64_t j = 0; j < o.pairs; ++j) {
    const TemplatePair p = set.pair(j);
    ASSERT_NE(p.first, p.second);
    EXPECT_EQ(set.identity_of(p.first) == set.identity_of(p.second), p.genuine) << "pair " << j;
    genuine += p.genuine ? 1 : 0;
  }
  EXPECT_EQ(genuine, 50);
  EXPECT_EQ(set.genuine_pairs(), 50);

  // IJB-C's proportions by default: 23,124 templates of 3,531 identities, 1 genuine pair in 800.
  SyntheticIjbOptions ijbc;
  ijbc.templates = 23124;
  ijbc.images = 23124;
  ijbc.pairs = 15658489;
  const SyntheticIjb full(ijbc);
  EXPECT_EQ(full.identities(), 3531);
  EXPECT_EQ(full.genuine_pairs(), 19557);

  SyntheticIjbOptions bad = small_set(8.0);
  bad.templates = 5;
  EXPECT_EQ(error_of([&] { SyntheticIjb s(bad); }),
            "--templates 5 is fewer than two per identity (3 identities): genuine pairs need two "
            "templates of one identity");
  bad = small_set(8.0);
  bad.images = 6;
  EXPECT_THROW(SyntheticIjb s(bad), UsageError);
}

TEST(SyntheticIjb, CropsAreDeterministicAndHoldTheFaceWhereTheLandmarksSay) {
  const SyntheticIjb a(small_set(8.0)), b(small_set(8.0));
  SyntheticIjbOptions other = small_set(8.0);
  other.seed = 6;
  const SyntheticIjb c(other);
  for (int64_t i : {0, 17, 29}) {
    const LooseCrop crop = a.loose_crop(i);
    EXPECT_EQ(crop.pixels, b.loose_crop(i).pixels);
    EXPECT_NE(crop.pixels, c.loose_crop(i).pixels);
    EXPECT_GE(std::min(crop.height, crop.width), 150);
    EXPECT_LE(std::max(crop.height, crop.width), 206);
    EXPECT_TRUE(crop.score >= 0.5f && crop.score <= 1.0f);
    // The similarity from the landmarks undoes the placement, up to the landmarks' noise.
    const Affine to_face = alignment_transform(crop.landmarks);
    for (const Point corner : {Point{0, 0}, Point{111, 0}, Point{0, 111}, Point{111, 111}}) {
      const Point back = to_face.apply(crop.face_to_crop.apply(corner));
      EXPECT_NEAR(back.x, corner.x, 1.0) << "image " << i;
      EXPECT_NEAR(back.y, corner.y, 1.0) << "image " << i;
    }
    // Each face corner lies inside the crop.
    for (const Point corner : {Point{-0.5, -0.5}, Point{111.5, 111.5}, Point{-0.5, 111.5}}) {
      const Point p = crop.face_to_crop.apply(corner);
      EXPECT_TRUE(p.x >= -0.5 && p.y >= -0.5 && p.x <= crop.width - 0.5 &&
                  p.y <= crop.height - 0.5);
    }
  }
}

// The mean absolute difference of two aligned faces, away from the 3-pixel border where the
// face's edge meets the background in the crop.
double interior_difference(const uint8_t* a, const uint8_t* b) {
  constexpr int kBorder = 3;
  double sum = 0.0;
  int64_t count = 0;
  for (int y = kBorder; y < kAlignedSide - kBorder; ++y) {
    for (int x = kBorder; x < kAlignedSide - kBorder; ++x) {
      for (int c = 0; c < 3; ++c) {
        const int64_t at = (static_cast<int64_t>(y) * kAlignedSide + x) * 3 + c;
        sum += std::abs(static_cast<int>(a[at]) - static_cast<int>(b[at]));
        ++count;
      }
    }
  }
  return sum / static_cast<double>(count);
}

TEST(IjbConversion, AlignmentRecoversEveryFaceOfASyntheticSet) {
  // Smooth faces (no per-pixel noise), so that what is left is the alignment's error. Measured on
  // 300 faces: the two warps alone cost 0.1 grey levels, with JPEG 0.7, with the landmarks' noise
  // (up to half a pixel) 1.1 on average and 2.3 at most; a face one pixel off costs 2.0 more.
  const SyntheticIjb set(small_set(0.0));
  const std::string root = temp_file("ijb-synthetic");
  set.write(root);
  IjbConversion conversion;
  conversion.root = root;
  conversion.target = IjbTarget::kIjbc;
  conversion.output = temp_file("ijb-synthetic.h5");
  conversion.workers = 2;
  const IjbConversionSummary summary = convert_ijb(conversion);
  EXPECT_EQ(summary.images, 30);
  EXPECT_EQ(summary.templates, 7);
  EXPECT_EQ(summary.pairs, 200);
  EXPECT_EQ(summary.genuine, 50);

  const Hdf5ImageDataset file(conversion.output, /*labelled=*/false);
  ASSERT_EQ(file.info().size, 30);
  std::vector<uint8_t> aligned(kFaceBytes), face(kFaceBytes), other(kFaceBytes);
  const torch::Tensor templates = file.file().read("templates");
  const torch::Tensor medias = file.file().read("medias");
  double worst = 0.0, total = 0.0;
  for (int64_t i = 0; i < 30; ++i) {
    file.read({i}, aligned.data());
    set.face(i, face.data());
    const double error = interior_difference(aligned.data(), face.data());
    worst = std::max(worst, error);
    total += error;
    EXPECT_LT(error, 3.0) << "image " << i;
    // Another identity's face is far: the bound above can fail.
    const int64_t stranger = (i + 5) % 30;
    if (set.identity_of(set.template_of(stranger)) != set.identity_of(set.template_of(i))) {
      set.face(stranger, other.data());
      EXPECT_GT(interior_difference(aligned.data(), other.data()), 10.0) << "image " << i;
    }
    EXPECT_EQ(templates[i].item<int64_t>(), set.template_id(set.template_of(i)));
    EXPECT_EQ(medias[i].item<int64_t>(), set.media_id(i));
  }
  EXPECT_LT(total / 30, 1.5);
  std::cout << "aligned faces: mean absolute difference " << total / 30 << " on average, " << worst
            << " at most\n";
  const torch::Tensor pairs = file.file().read("pairs");
  const torch::Tensor labels = file.file().read("pair_labels");
  ASSERT_EQ(pairs.sizes(), (std::vector<int64_t>{200, 2}));
  for (int64_t j = 0; j < 200; ++j) {
    const TemplatePair p = set.pair(j);
    EXPECT_EQ(pairs[j][0].item<int64_t>(), set.template_id(p.first));
    EXPECT_EQ(pairs[j][1].item<int64_t>(), set.template_id(p.second));
    EXPECT_EQ(labels[j].item<uint8_t>(), p.genuine ? 1 : 0);
  }
  EXPECT_EQ(file.file().string_attribute("/", "ijb_target"), "IJBC");
  EXPECT_EQ(file.file().string_attribute("/", "alignment"), "arcface-112");

  // A synthetic set is never written over an existing one.
  EXPECT_NE(error_of([&] { set.write(root); }).find("exists and is not an empty directory"),
            std::string::npos);
}

}  // namespace
}  // namespace myriad
