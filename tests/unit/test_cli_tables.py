"""Tables fitted to the terminal: what gives up width first, and what never does."""

from __future__ import annotations

import io

from rich.console import Console

from worker.cli.output import Column, Fit, fitted

JOB_ID = "01a23796-62fc-7ba7-b30c-f6fc28c74816"


def printed(columns: list[Column], width: int) -> tuple[list[str], bool]:
    table, shortened = fitted(columns, width)
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
    return [line.rstrip() for line in console.export_text().splitlines()], shortened


def test_a_table_that_fits_is_printed_whole() -> None:
    lines, shortened = printed(
        [Column("id", [JOB_ID], Fit.TAIL, least=9), Column("status", ["processing"])], 80
    )
    assert lines == ["id                                    status", f"{JOB_ID}  processing"]
    assert not shortened


def test_the_error_goes_first_then_the_id_then_the_task_wraps_and_the_status_stays() -> None:
    columns = [
        Column("id", [JOB_ID], Fit.TAIL, least=9),
        Column("task", ["reports.monthly.generate_invoice_batch"], Fit.WRAP, least=12),
        Column("status", ["processing"]),
        Column("error", ["ValueError: the attachment is too large"], Fit.DROP, least=12),
    ]
    wide, _ = printed(columns, 120)
    assert "ValueError" in wide[1] and JOB_ID in wide[1]
    no_error, shortened = printed(columns, 90)
    assert "error" not in no_error[0] and JOB_ID in no_error[1] and not shortened
    narrow, shortened = printed(columns, 61)
    assert shortened and narrow[1].startswith("…" + JOB_ID[-8:])
    assert "reports.monthly.generate_invoice_batch" in narrow[1]  # the task still fits
    squeezed, _ = printed(columns, 35)  # the least widths: the id's 9, the task's 12
    assert max(len(line) for line in squeezed) <= 35
    assert squeezed[1].endswith("processing")  # never cut
    task = "".join(line[11:23].strip() for line in squeezed[1:])
    assert task == "reports.monthly.generate_invoice_batch"  # wrapped, not cut


def test_a_name_that_may_be_cut_ends_with_an_ellipsis_before_a_task_wraps() -> None:
    columns = [
        Column("task", ["send_email"], Fit.WRAP, least=10),
        Column("queue", ["billing-eu-west"], Fit.CUT, least=8),
    ]
    lines, _ = printed(columns, 20)
    assert lines[1] == "send_email  billing…"
