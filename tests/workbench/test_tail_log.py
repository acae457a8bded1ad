"""The run page's event tail and the logs beside the charts grow without laying the page out: only a write that
adds a scrollbar does (a layout of a run page with the grid cost a key 30-150 ms)."""

from __future__ import annotations

import asyncio
from typing import Any

from textual.app import App, ComposeResult

from prime_lab.workbench.widgets.tail_log import TailLog


class TailApp(App[None]):
    def compose(self) -> ComposeResult:
        yield TailLog(max_lines=50, wrap=False, markup=False, highlight=False)


def test_writes_lay_the_page_out_only_when_a_scrollbar_comes() -> None:
    async def scenario() -> None:
        app = TailApp()
        async with app.run_test(size=(40, 12)) as pilot:
            log = app.query_one(TailLog)
            layouts: list[int] = []
            refresh = log.refresh

            def counted(*regions: Any, **kwargs: Any) -> TailLog:
                if kwargs.get("layout"):
                    layouts.append(len(log.lines))
                return refresh(*regions, **kwargs)

            log.refresh = counted  # type: ignore[method-assign]
            log.write("short")
            await pilot.pause()
            assert layouts == []  # (no scrollbar yet)
            log.write("\n".join(f"line {i}" for i in range(20)))  # taller than the log: the vertical scrollbar
            await pilot.pause()
            assert layouts == [21] and log.show_vertical_scrollbar
            for batch in range(5):  # more lines, up to max_lines and past it: no layout
                log.write("\n".join(f"more {batch} {i}" for i in range(10)))
            await pilot.pause()
            assert layouts == [21] and len(log.lines) == 50 and log.virtual_size.height == 50
            assert log.scroll_y == log.max_scroll_y  # (still following the end)
            assert log.vertical_scrollbar.window_virtual_size == 50  # (its thumb follows the new size)
            log.write("x" * 200)  # wider than the log: the horizontal scrollbar
            await pilot.pause()
            assert layouts[0] == 21 and set(layouts[1:]) == {50} and log.show_horizontal_scrollbar

    asyncio.run(scenario())
