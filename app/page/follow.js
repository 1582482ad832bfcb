// The sidebar's answer follows the stream: its text box (150 px) and the box of timed tokens show
// their newest lines as tokens arrive (each update replaces their HTML, which left them at their
// top: on a projector the class saw a long answer's first lines while its newest scrolled out of
// view). A reader who scrolls a box up keeps that place; back at its bottom, it follows again.
(() => {
  const BOXES = {text: "#tt-answer .tt-answer", timed: "#tt-answer .tt-timing"};
  const kept = {};  // which -> the scrollTop the reader left the box at (absent: it follows the newest)
  let shown = "", shownChips = 0;
  function atBottom(box) { return box.scrollTop + box.clientHeight >= box.scrollHeight - 4; }
  function follow() {
    const text = document.querySelector(BOXES.text), timed = document.querySelector(BOXES.timed);
    const now = text ? text.textContent : "";  // a token with no text of its own still adds a timed chip
    const chips = timed ? timed.childElementCount : 0;
    if (now === shown && chips === shownChips) return;
    shownChips = chips;
    if (!now.startsWith(shown.replace(/● streaming$/, "").slice(0, 40))) { delete kept.text; delete kept.timed; }
    shown = now;  // a new request's answer starts at the top: it follows again
    for (const [which, sel] of Object.entries(BOXES)) {
      const box = document.querySelector(sel);
      if (box) box.scrollTop = which in kept ? kept[which] : box.scrollHeight;
    }
  }
  document.addEventListener("scroll", (ev) => {
    for (const [which, sel] of Object.entries(BOXES)) {
      if (ev.target.matches && ev.target.matches(sel)) {
        if (atBottom(ev.target)) delete kept[which]; else kept[which] = ev.target.scrollTop;
      }
    }
  }, true);
  // only the answer's own changes are watched (the page swaps large panels several times a second); Gradio
  // may render the answer's box late or anew, so the watch moves to whichever #tt-answer is there now
  const watch = new MutationObserver(follow);
  let watched = null;
  setInterval(() => {
    const el = document.getElementById("tt-answer");
    if (el && el !== watched) {
      watch.disconnect();
      watch.observe(el, {childList: true, subtree: true, characterData: true});
      watched = el;
      follow();
    }
  }, 500);
})();
