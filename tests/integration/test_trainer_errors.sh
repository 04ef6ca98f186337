#!/usr/bin/env bash
# Bad input to ferry-trainer: each case must give a one-line error naming the
# problem and a non-zero exit, never a crash.
. "$(dirname "$0")/lib.sh"
D="$FERRY_SRC/data/ptb"

mkdir -p "$TMP/empty" "$TMP/nofile" "$TMP/dirfile" "$TMP/tiny"
: >"$TMP/empty/train.txt"
cp "$D/valid.txt" "$TMP/empty/valid.txt"
cp "$D/test.txt" "$TMP/empty/test.txt"
cp "$D/valid.txt" "$TMP/nofile/valid.txt"
mkdir "$TMP/dirfile/train.txt"
head -c 20000 "$D/train.txt" >"$TMP/tiny/train.txt"
cp "$D/valid.txt" "$D/test.txt" "$TMP/tiny/"

expect_error "missing corpus dir" "does-not-exist" "$TRAINER" --data "$TMP/does-not-exist"
expect_error "missing train.txt" "train.txt" "$TRAINER" --data "$TMP/nofile"
expect_error "empty train.txt" "no tokens" "$TRAINER" --data "$TMP/empty"
expect_error "unreadable train.txt (a directory)" "train.txt" "$TRAINER" --data "$TMP/dirfile"
expect_error "unknown flag" "unknown flag --bogus" "$TRAINER" --bogus 1
expect_error "malformed number" "--lr: 'abc' is not a number" "$TRAINER" --lr abc
expect_error "integer expected" "--epochs: '2.5' is not an integer" "$TRAINER" --epochs 2.5
expect_error "out of range" "--dropout" "$TRAINER" --dropout 1.5
expect_error "unknown optimizer" "not one of sgd|adagrad|adadelta|adam|adamw" \
    "$TRAINER" --optimizer rmsprop
expect_error "missing value" "missing value for --lr" "$TRAINER" --lr
expect_error "unknown device" "unknown device" "$TRAINER" --data "$TMP/tiny" --device tpu
expect_error "missing checkpoint" "cannot open checkpoint" \
    "$TRAINER" --data "$TMP/tiny" --load "$TMP/none.ck" --max-steps 1

# A checkpoint of another model shape is refused with both shapes named.
"$TRAINER" --data "$TMP/tiny" --emsize 16 --nhid 16 --epochs 1 --max-steps 2 \
    --save "$TMP/small.ck" 2>"$TMP/log" || fail "could not make a checkpoint: $(cat "$TMP/log")"
expect_error "a flag contradicting the checkpoint" "--emsize 32 contradicts the checkpoint" \
    "$TRAINER" --data "$TMP/tiny" --emsize 32 --nhid 16 --max-steps 1 --load "$TMP/small.ck"
ck=$(ls "$TMP"/small.ck.* | head -1)
head -c 100 "$ck" >"$TMP/trunc.ck"
expect_error "truncated checkpoint" "truncated" \
    "$TRAINER" --data "$TMP/tiny" --emsize 16 --nhid 16 --max-steps 1 --load "$TMP/trunc.ck"
echo garbage >"$TMP/garbage.ck"
expect_error "foreign checkpoint" "is not a FERRYCK2 file" \
    "$TRAINER" --data "$TMP/tiny" --emsize 16 --nhid 16 --max-steps 1 --load "$TMP/garbage.ck"
# Another format version, a flipped bit, appended bytes: each named.
cp "$ck" "$TMP/v9.ck" && printf '\x09' | dd of="$TMP/v9.ck" bs=1 seek=8 conv=notrunc 2>/dev/null
expect_error "another format version" "format 9, this build reads format 2" \
    "$TRAINER" --data "$TMP/tiny" --load "$TMP/v9.ck"
cp "$ck" "$TMP/flip.ck" && printf '\x5a' | dd of="$TMP/flip.ck" bs=1 seek=$(($(stat -c %s "$ck") - 40)) conv=notrunc 2>/dev/null
expect_error "a flipped byte" "fails its CRC-32" "$TRAINER" --data "$TMP/tiny" --load "$TMP/flip.ck"
cp "$ck" "$TMP/app.ck" && head -c 100 /dev/zero >>"$TMP/app.ck"
expect_error "100 appended bytes" "100 bytes after the last section" \
    "$TRAINER" --data "$TMP/tiny" --load "$TMP/app.ck"
# A learning rate written into the file is covered by its CRC like everything else.
off=$(grep -abo 'lr=' "$ck" | head -1 | cut -d: -f1)
cp "$ck" "$TMP/lr.ck" && printf '9' | dd of="$TMP/lr.ck" bs=1 seek=$((off + 3)) conv=notrunc 2>/dev/null
expect_error "an edited learning rate" "fails its CRC-32" "$TRAINER" --data "$TMP/tiny" --load "$TMP/lr.ck"
finish
