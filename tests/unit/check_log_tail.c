/* check_log_tail.c: the stderr lines a failure quotes stay within their
 * bounds (10 lines, 2 KB, valid UTF-8, no control characters but
 * newlines), whatever the script wrote. */
#include "log_tail.h"

#include "../check_run.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char out[LOG_TAIL_MAX_BYTES + 1];

static size_t clean(const char *s) {
  return log_tail_clean(s, strlen(s), out);
}

START_TEST(the_last_ten_lines_without_blank_ends) {
  char in[512];
  size_t n = 0;

  n += (size_t)snprintf(in + n, sizeof(in) - n, "\n\n");
  for (int i = 0; i < 20; i++)
    n += (size_t)snprintf(in + n, sizeof(in) - n, "line %d\n", i);
  snprintf(in + n, sizeof(in) - n, "\n  \n");
  ck_assert_uint_eq(clean(in), strlen(out));
  ck_assert_str_eq(out, "line 10\nline 11\nline 12\nline 13\nline 14\nline 15\nline 16\nline "
                        "17\nline 18\nline 19");
  ck_assert_uint_eq(clean("only\n"), 4);
  ck_assert_str_eq(out, "only");
  ck_assert_uint_eq(clean(""), 0);
  ck_assert_uint_eq(clean("\n \n\t\n"), 0);
  ck_assert_str_eq(out, "");
}
END_TEST

START_TEST(control_characters_and_escapes_go) {
  clean("\x1b[1;31mError\x1b[0m:\tbad\x07 value\r\nstep 1\rstep 2\x01\n\xc2\x85x\x1b]0;title\x07y");
  ck_assert_str_eq(out, "Error: bad value\nstep 1\nstep 2\nxy");
}
END_TEST

/* A title escape a program never ended (no BEL, no ESC \\) ends at its
 * line's end: the traceback after it is quoted. */
START_TEST(an_unterminated_title_escape_keeps_the_traceback_after_it) {
  char in[600];

  clean("\x1b]0;my title\nTraceback (most recent call last):\n  File \"t.py\", line 1\n"
        "ZeroDivisionError: division by zero\n");
  ck_assert_str_eq(out, "Traceback (most recent call last):\n  File \"t.py\", line 1\n"
                        "ZeroDivisionError: division by zero");
  /* One with no line end either stops at 256 bytes. */
  memset(in, 'x', 300);
  memcpy(in, "\x1b]", 2);
  snprintf(in + 300, sizeof(in) - 300, "\nlast words");
  clean(in);
  ck_assert_str_eq(out, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\nlast words");
}
END_TEST

/* A CSI cut short, or an ESC on its own, takes no newline and no character
 * with it. */
START_TEST(a_broken_escape_keeps_the_next_line_whole) {
  clean("step 9\x1b[\nZeroDivisionError: x\nA\x1b\nB\n\x1b\xc3\xa9t\xc3\xa9 \x1b(Bok\x1b[1;\x01z");
  ck_assert_str_eq(out, "step 9\nZeroDivisionError: x\nA\nB\n\xc3\xa9t\xc3\xa9 okz");
}
END_TEST

/* Bidi overrides and isolates, zero-width characters and U+2028/9 would
 * make a terminal show the quote otherwise than the script wrote it. */
START_TEST(bidi_and_zero_width_characters_go) {
  clean("a\xe2\x80\xae"
        "b\xe2\x80\x8b"
        "c\xe2\x81\xa6"
        "d\xe2\x80\xa8"
        "e\xef\xbb\xbf\xe2\x80\x8f"
        "f\xe2\x81\xa9 \xe2\x80\x94 \xe2\x80\xa6");
  /* The dash and the ellipsis stay. */
  ck_assert_str_eq(out, "abcdef \xe2\x80\x94 \xe2\x80\xa6");
}
END_TEST

START_TEST(malformed_utf8_becomes_question_marks) {
  /* a cut character at the start goes; é, € and 😀 stay; a stray
   * continuation byte, an overlong '/', a surrogate and a cut end are '?' */
  clean("\xa9\xa9 ok \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 \x80 \xc0\xaf \xed\xa0\x80 \xe2\x82");
  ck_assert_str_eq(out, " ok \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 ? ?? ??? ??");
}
END_TEST

START_TEST(at_most_2_kb_whole_lines_first) {
  char in[8192], *p = in;

  /* Lines of 300 bytes: 6 fit in 2048 bytes with their newlines, 7 do not. */
  for (int i = 0; i < 9; i++) {
    memset(p, 'a' + i, 299);
    p[299] = '\n';
    p += 300;
  }
  *p = '\0';
  ck_assert_uint_eq(clean(in), 6 * 300 - 1);
  ck_assert_int_eq(out[0], 'd');
  ck_assert_int_eq(out[strlen(out) - 1], 'i');
}
END_TEST

START_TEST(a_long_last_line_keeps_its_end_cut_at_a_character) {
  char in[8192];
  size_t n = 0;

  /* 3000 bytes of é after an 'x': its end is kept, after "...", and cut
   * between two characters. */
  in[n++] = 'x';
  for (int i = 0; i < 1500; i++) {
    in[n++] = (char)0xc3;
    in[n++] = (char)0xa9;
  }
  in[n++] = 'z';
  in[n] = '\0';
  ck_assert_uint_le(clean(in), LOG_TAIL_MAX_BYTES);
  ck_assert_uint_ge(strlen(out), LOG_TAIL_MAX_BYTES - 4);
  ck_assert(strncmp(out, "...\xc3\xa9", 5) == 0);
  ck_assert_int_eq(out[strlen(out) - 1], 'z');
}
END_TEST

int main(void) {
  Suite *s = suite_create("log_tail");
  TCase *tc = tcase_create("clean");

  tcase_add_test(tc, the_last_ten_lines_without_blank_ends);
  tcase_add_test(tc, control_characters_and_escapes_go);
  tcase_add_test(tc, an_unterminated_title_escape_keeps_the_traceback_after_it);
  tcase_add_test(tc, a_broken_escape_keeps_the_next_line_whole);
  tcase_add_test(tc, bidi_and_zero_width_characters_go);
  tcase_add_test(tc, malformed_utf8_becomes_question_marks);
  tcase_add_test(tc, at_most_2_kb_whole_lines_first);
  tcase_add_test(tc, a_long_last_line_keeps_its_end_cut_at_a_character);
  suite_add_tcase(s, tc);
  return check_run(s);
}
