"""One JUnit XML writer for every command that reports to CI (gate, upgrade): suites of cases with
failures, skips and system-out, written the same way everywhere."""

from __future__ import annotations

from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr


@dataclass(frozen=True)
class Case:
    classname: str
    name: str
    seconds: float | None = None  # written as time="%.1f" when given
    failure: str | None = None  # the failure message (also the element's text)
    failure_type: str = ""
    skipped: str | None = None  # the skip message
    system_out: str | None = None


def junit_xml(suite: str, cases: list[Case]) -> str:
    """A <testsuites> document with one <testsuite> named `suite`; counts computed from the cases."""
    fails = sum(c.failure is not None for c in cases)
    skipped = sum(c.failure is None and c.skipped is not None for c in cases)
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuites><testsuite name={quoteattr(suite)} tests="{len(cases)}" failures="{fails}" errors="0" skipped="{skipped}">',
    ]
    for c in cases:
        time = f' time="{c.seconds:.1f}"' if c.seconds is not None else ""
        out.append(f"  <testcase classname={quoteattr(c.classname)} name={quoteattr(c.name)}{time}>")
        if c.failure is not None:
            out.append(
                f"    <failure message={quoteattr(c.failure)} type={quoteattr(c.failure_type)}>{escape(c.failure)}</failure>"
            )
        elif c.skipped is not None:
            out.append(f"    <skipped message={quoteattr(c.skipped)}/>")
        if c.system_out is not None:
            out.append(f"    <system-out>{escape(c.system_out)}</system-out>")
        out.append("  </testcase>")
    out.append("</testsuite></testsuites>")
    return "\n".join(out) + "\n"
