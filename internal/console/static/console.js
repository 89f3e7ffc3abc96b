// The console's only script: a button with data-copy="ID" copies the text
// of the element ID (a connection string shown once). Without it the text
// is still there to select; nothing else on the console needs JavaScript.
"use strict";
document.addEventListener("click", function (e) {
  var b = e.target.closest("button[data-copy]");
  if (!b) return;
  var el = document.getElementById(b.dataset.copy);
  if (!el) return;
  var done = function (word) { b.textContent = word; b.classList.add("copied"); };
  var select = function () {
    var r = document.createRange();
    r.selectNodeContents(el);
    var s = window.getSelection();
    s.removeAllRanges();
    s.addRange(r);
    done(document.execCommand && document.execCommand("copy") ? "Copied" : "Selected");
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(el.textContent).then(function () { done("Copied"); }, select);
  } else {
    select();
  }
});
