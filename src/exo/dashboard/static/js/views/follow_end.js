// Keeps a scrolling list at its end while what it shows grows (a streaming reply), until the reader scrolls up; back
// at the end, it follows again.
//
// The reader's scrolls are told from this code's own by where they left the list, never by how far it is from its
// end when a scroll event comes: that event fires a frame after its scroll, and a fast stream may have grown the list
// far past the end by then. This code only ever scrolls down to the end, so following stops on a scroll up from
// where the list was last put or seen, and on the reader's own ways up (the wheel, keys, a finger) at once, before
// the next draw could undo a scroll they animate. It starts again on a scroll down to the end the list had when the
// reader was last seen moving (or on End), whatever came after it: the page may learn of a scroll the browser made
// off the main thread only after more draws. Each draw first looks at what the reader did since the last one.

// Within this many pixels of the end, the list is at its end.
export const FOLLOW_WITHIN_PX = 48;
const KEYS_UP = new Set(["ArrowUp", "PageUp", "Home"]);

export function followEnd(list) {
  let following = true;
  // Where the list was last put or seen moving to, and how tall it was then.
  let seenTop = list.scrollTop;
  let seenHeight = list.scrollHeight;
  let holdingScrollbar = false;  // while the reader holds the scrollbar, draws leave the list where it is

  const canScrollUp = () => list.scrollTop > 0;
  function look() {
    const top = list.scrollTop;
    if (top === seenTop) return;
    // Up yet still at the end: the list shrank under it, or the reader barely moved; following stays as it was.
    if (top < seenTop && list.scrollHeight - top - list.clientHeight >= FOLLOW_WITHIN_PX) following = false;
    else if (top > seenTop && seenHeight - top - list.clientHeight < FOLLOW_WITHIN_PX) following = true;
    seenTop = top;
    seenHeight = list.scrollHeight;
  }
  function toEnd() {
    list.scrollTop = list.scrollHeight;
    seenTop = list.scrollTop;
    seenHeight = list.scrollHeight;
  }

  list.addEventListener("scroll", look);
  list.addEventListener("wheel", (event) => {
    if (event.deltaY < 0 && canScrollUp()) following = false;
  }, { passive: true });
  list.addEventListener("keydown", (event) => {
    if (event.altKey || event.metaKey) return;
    if (event.key === "End") {
      event.preventDefault();
      following = true;
      toEnd();
    } else if ((KEYS_UP.has(event.key) || (event.key === " " && event.shiftKey)) && canScrollUp()) {
      following = false;
    }
  });
  let touchY = null;
  list.addEventListener("touchstart", (event) => { touchY = event.touches[0]?.clientY ?? null; }, { passive: true });
  list.addEventListener("touchmove", (event) => {
    const y = event.touches[0]?.clientY ?? null;
    // A finger moving down the screen brings what came before into view.
    if (touchY !== null && y !== null && y > touchY && canScrollUp()) following = false;
    touchY = y;
  }, { passive: true });
  // A press on the list itself right of its content box is on its scrollbar.
  list.addEventListener("pointerdown", (event) => {
    if (event.target === list && event.offsetX >= list.clientWidth) holdingScrollbar = true;
  });
  for (const type of ["pointerup", "pointercancel"]) window.addEventListener(type, () => { holdingScrollbar = false; });

  return {
    // What the list shows changed: back to its end, if following.
    changed() {
      look();
      if (following && !holdingScrollbar) toEnd();
    },
    // Something new to show from its end (a message sent, a conversation opened): follow again.
    restart() {
      following = true;
      toEnd();
    },
  };
}
