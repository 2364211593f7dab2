"""Where glossary terms land in a translation: whether a term is used, glued to the text
around it, or placed after the sentence's final mark (`placement`); and WMT 2021's window
overlap (Alam et al. 2021, `window_overlap`): whether the words around a term are those a
reference places around it.
"""

from __future__ import annotations

import re

FINAL = ".!?。！？"
OPENING = "([{\"'„“‚‘«»"


def placement(src: str, out: str, target: str) -> tuple[bool, bool, bool]:
    """(used, glued, after the final mark) of one term in one output."""
    used = re.search(rf"(?<!\w){re.escape(target)}(?!\w)", out) is not None
    glued = after = False
    n_final = max(1, sum(src.count(m) for m in FINAL))
    marks = [i for i, ch in enumerate(out) if ch in FINAL]
    end = marks[n_final - 1] if len(marks) >= n_final else len(out)
    for m in re.finditer(re.escape(target), out):
        before = out[m.start() - 1] if m.start() > 0 else " "
        following = out[m.end()] if m.end() < len(out) else " "
        glued |= not (before.isspace() or before in OPENING)
        glued |= following.isalnum() or following in "-_"
        after |= m.start() > end
    return used, glued, after


def window_overlap(ref: str, out: str, target: str, size: int) -> float | None:
    """Alam et al. 2021's window overlap for one term; None where the reference lacks it."""
    ref_words, out_words = ref.split(), out.split()
    n = len(target.split())

    def windows(words: list[str]) -> list[set[str]]:
        found = []
        for i in range(len(words) - n + 1):
            if re.sub(r"[^\w\s]", "", " ".join(words[i : i + n])) == target:
                found.append(set(words[max(0, i - size) : i]) | set(words[i + n : i + n + size]))
        return found

    ref_win, out_win = windows(ref_words), windows(out_words)
    if not ref_win or not ref_win[0]:
        return None
    if not out_win:
        return 0.0
    return max(len(ref_win[0] & w) / len(ref_win[0]) for w in out_win)
