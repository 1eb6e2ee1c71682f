// The reference outputs of Hugging Face tokenizers (its own Node binding) for
// troupe's tokenizer tests and benchmark.
//
// Usage: node reference.js REQUEST.json OUTPUT.json
// REQUEST: {"tokenizer": path to a tokenizer.json,
//           "texts": [base64 of UTF-8 bytes, ...],       (optional)
//           "decode": [[id, ...], ...],                   (optional)
//           "bench": {"texts": [base64, ...], "rounds": n} (optional)}
// OUTPUT:  {"encode": [{"ids", "ids_special", "decoded", "decoded_skip"}],
//           "decode": [{"text", "text_skip"}],
//           "bench": {"seconds": per round, "tokens", "bytes"}}
// Bytes that are not UTF-8 reach the binding as Node decodes them (one
// U+FFFD per maximal ill-formed subsequence): a JavaScript string cannot
// carry them.
'use strict';
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

async function main() {
  const [requestPath, outputPath] = process.argv.slice(2);
  const request = JSON.parse(fs.readFileSync(requestPath, 'utf8'));
  const tok = Tokenizer.fromFile(request.tokenizer);
  const texts = (request.texts || []).map((b) => Buffer.from(b, 'base64').toString('utf8'));
  const out = { encode: [], decode: [] };
  for (const text of texts) {
    const plain = await tok.encode(text, null, { addSpecialTokens: false });
    const special = await tok.encode(text, null, { addSpecialTokens: true });
    const ids = plain.getIds();
    out.encode.push({
      ids,
      ids_special: special.getIds(),
      decoded: await tok.decode(ids, false),
      decoded_skip: await tok.decode(special.getIds(), true),
    });
  }
  for (const ids of request.decode || [])
    out.decode.push({ text: await tok.decode(ids, false), text_skip: await tok.decode(ids, true) });
  if (request.bench) {
    const bench = request.bench.texts.map((b) => Buffer.from(b, 'base64').toString('utf8'));
    let tokens = 0;
    let bytes = 0;
    for (const t of bench) { // warm-up, and the totals
      tokens += (await tok.encode(t, null, { addSpecialTokens: false })).getIds().length;
      bytes += Buffer.byteLength(t, 'utf8');
    }
    const rounds = request.bench.rounds || 1;
    const t0 = process.hrtime.bigint();
    for (let r = 0; r < rounds; r++)
      for (const t of bench) await tok.encode(t, null, { addSpecialTokens: false });
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9 / rounds;
    out.bench = { seconds, tokens, bytes };
  }
  fs.writeFileSync(outputPath, JSON.stringify(out));
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
