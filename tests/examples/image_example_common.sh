# Sourced by the image examples' smoke tests.
# write_idx_dataset DIR TRAIN TEST writes Fashion-MNIST's four IDX
# files into DIR with TRAIN and TEST images of 28x28. IDX: magic 0x0000 08 <dims>, big-endian uint32 sizes, then
# u8 data. Image i is a gray level set by its label (i % 10) plus a little pattern, so the files differ from
# image to image.
write_idx_dataset() {
  local dir=$1 train=$2 test=$3
  mkdir -p "$dir"
  idx() {
    perl -e 'my ($kind, $n) = @ARGV;
      if ($kind eq "images") { print pack("N4", 0x803, $n, 28, 28), map { my $i = $_; pack("C*", map { (($i % 10) * 25 + $_ % 7) % 256 } 0 .. 783) } 0 .. $n - 1 }
      else { print pack("N2", 0x801, $n), pack("C*", map { $_ % 10 } 0 .. $n - 1) }' "$@"
  }
  idx images "$train" > "$dir/train-images-idx3-ubyte"
  idx labels "$train" > "$dir/train-labels-idx1-ubyte"
  idx images "$test" > "$dir/t10k-images-idx3-ubyte"
  idx labels "$test" > "$dir/t10k-labels-idx1-ubyte"
}

# check_classifier_summary RUN_DIR LOG: RUN_DIR/summary.json carries the example's own results, test_accuracy in
# [0, 1], a positive finite test_loss and images_per_second, and LOG has the test accuracy line; exits 1 if not.
check_classifier_summary() {
  local summary=$1/summary.json log=$2 acc loss rate
  [[ -s $summary ]] || { echo "missing summary.json"; cat "$log"; exit 1; }
  value() { perl -ne 'print $1 if /^  "\Q'"$1"'\E": ([-+0-9.eE]+),?$/' "$summary"; }
  acc=$(value test_accuracy) loss=$(value test_loss) rate=$(value images_per_second)
  [[ -n $acc && -n $loss && -n $rate ]] ||
    { echo "summary.json lacks test_accuracy ($acc), test_loss ($loss) or images_per_second ($rate):"; cat "$summary"; exit 1; }
  awk -v a="$acc" -v l="$loss" -v r="$rate" 'BEGIN { exit !(a >= 0 && a <= 1 && l > 0 && l < 1e6 && r > 0) }' ||
    { echo "out of range: test_accuracy $acc, test_loss $loss, images_per_second $rate"; exit 1; }
  grep -q "test accuracy" "$log" || { echo "no test accuracy line"; cat "$log"; exit 1; }
}
