// MathJax configuration: typeset only what pymdownx.arithmatex marked (generic mode writes
// \( ... \) and \[ ... \] inside elements of class "arithmatex"). The engine itself is
// assets/mathjax/tex-svg-full.js, copied into the site at build time (docs/hooks/factor_docs.py).
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
  svg: { fontCache: "global" },
};

// Material's instant navigation swaps pages without a reload; typeset each new one. On a full
// page load MathJax typesets by itself once it has started.
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && window.MathJax.typesetPromise) {
      window.MathJax.typesetClear();
      window.MathJax.texReset();
      window.MathJax.typesetPromise();
    }
  });
}
