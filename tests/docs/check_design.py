#!/usr/bin/env python3
"""check_design.py: docs/design.md matches the code.

- every route in the controller's route tables (controller/api_*.c, one per
  handler file) is in one of design.md's endpoint tables, and every endpoint
  there is routed;
- every option `muster-controller --help` lists is in design.md's controller
  section, and every option named there exists;
- every `muster-train` option design.md names exists;
- nothing in the repository points outside it (to a folder beside the clone).

usage: check_design.py BUILD_DIR SOURCE_DIR
"""
import glob
import re
import subprocess
import sys

build, src = sys.argv[1], sys.argv[2]
failures = []


def check(ok, what):
    print(("ok - " if ok else "not ok - ") + what)
    if not ok:
        failures.append(what)


design = open(src + "/docs/design.md").read()
table = "".join(open(f).read() for f in sorted(glob.glob(src + "/controller/api_*.c")))
routed = set(re.findall(r'\{"(GET|POST|PUT|DELETE)", "(/[^"]*)", AUTH_', table))
documented = set(re.findall(r'^\| `(GET|POST|PUT|DELETE) (/[^`]*)`', design, re.M))
check(len(routed) >= 10, "the route table was read (%d routes)" % len(routed))
for m, p in sorted(routed - documented):
    check(False, "%s %s is routed but not in docs/design.md" % (m, p))
for m, p in sorted(documented - routed):
    check(False, "%s %s is in docs/design.md but not routed" % (m, p))
check(routed == documented, "the %d routes and design.md's endpoint tables agree" % len(routed))

# The check itself can fail: with one endpoint row taken out of the text, it
# must notice.
row = re.search(r'^\| `GET /api/v1/workers/\{id\}` .*$', design, re.M)
mutated = set(re.findall(r'^\| `(GET|POST|PUT|DELETE) (/[^`]*)`',
                         design.replace(row.group(0), "") if row else design, re.M))
check(row is not None and mutated != routed, "an endpoint missing from design.md is noticed")

helptext = subprocess.run([build + "/muster-controller", "--help"], capture_output=True,
                          text=True).stdout
have = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", helptext))
section = design.split("## The controller", 1)[1].split("\n## ", 1)[0]
named = set(re.findall(r"`(--[a-z][a-z-]*)", section))
check(len(have) >= 10, "muster-controller --help was read (%d options)" % len(have))
check(have == named, "design.md names exactly muster-controller's options (missing: %s; "
      "unknown: %s)" % (sorted(have - named) or "none", sorted(named - have) or "none"))

trainhelp = subprocess.run([build + "/muster-train", "--help"], capture_output=True,
                           text=True)
train_have = set(re.findall(r"(--[a-z][a-z-]*)", trainhelp.stdout + trainhelp.stderr))
section = design.split("`muster-train`:", 1)[1]
train_named = set(re.findall(r"`(--[a-z][a-z-]*)", section))
check(train_named and train_named <= train_have,
      "every muster-train option design.md names exists (unknown: %s)"
      % (sorted(train_named - train_have) or "none"))

out = subprocess.run(["git", "-C", src, "grep", "-n", r"\.\./shared"], capture_output=True,
                     text=True).stdout
check(out.strip() == "", "nothing in the repository points outside it" +
      ("" if not out.strip() else ":\n" + out))

print("%d failed" % len(failures))
sys.exit(1 if failures else 0)
