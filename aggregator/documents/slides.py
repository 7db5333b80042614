"""PPTX -> Markdown with python-pptx: one `## Slide N` section per slide (its title in the heading), the text of its
shapes and tables in reading order, then its speaker notes."""

from __future__ import annotations

import io
from typing import Any

from aggregator.documents.failures import OverLimit, Unreadable
from aggregator.documents.markdown import Budget, table
from aggregator.documents.zipped import check_zip
from aggregator.manifest.model import ConvertSettings

__all__ = ["pptx_to_markdown"]


def pptx_to_markdown(data: bytes, limits: ConvertSettings) -> str:
    import pptx

    with check_zip(data, "PPTX", limits.max_unzipped_bytes) as archive:
        held = sum(part.file_size for part in archive.infolist())
    if held > limits.max_memory:  # python-pptx reads every part into memory before anything else
        raise OverLimit(f"its parts hold {held} bytes uncompressed, which are read whole: more than "
                        f"{limits.max_memory}", "maxMemory")
    try:
        presentation = pptx.Presentation(io.BytesIO(data))
        slides = list(presentation.slides)
    except MemoryError:  # an Exception too: the worker reports the limit convert.maxMemory
        raise
    except Exception:  # python-pptx raises KeyError, ValueError, lxml errors... for a broken package
        raise Unreadable("it is a corrupt or unreadable PPTX file") from None
    out = Budget(limits.max_chars)
    for number, slide in enumerate(slides[: limits.max_pages], 1):
        if not out.add(_slide(number, slide)):
            break
    if not out.full and len(slides) > limits.max_pages:
        out.note(f"[... cut after slide {limits.max_pages} of {len(slides)}: limit convert.maxPages]")
    return out.text()


def _slide(number: int, slide: Any) -> str:
    title_shape = slide.shapes.title
    title = title_shape.text_frame.text.strip() if title_shape is not None and title_shape.has_text_frame else ""
    parts = [f"## Slide {number}" + (f": {' '.join(title.split())}" if title else "")]
    # Reading order: top to bottom, then left to right (shapes without a position last).
    shapes = sorted(slide.shapes, key=lambda s: (s.top is None, s.top or 0, s.left or 0))
    for shape in shapes:
        if title_shape is not None and shape.shape_id == title_shape.shape_id:
            continue
        parts.extend(_shape(shape))
    if slide.has_notes_slide:
        notes = slide.notes_slide.notes_text_frame
        text = notes.text.strip() if notes is not None else ""
        if text:
            parts.append("Notes:\n\n" + text)
    return "\n\n".join(p for p in parts if p)


def _shape(shape: Any) -> list[str]:
    if getattr(shape, "has_table", False) and shape.has_table:
        return [table([cell.text for cell in row.cells] for row in shape.table.rows)]
    if shape.shape_type is not None and int(shape.shape_type) == 6:  # a group: its members, in order
        return [text for member in shape.shapes for text in _shape(member)]
    if shape.has_text_frame:
        return [shape.text_frame.text.strip()]
    return []
