// Run a panel's transformations through Grafana's own code (@grafana/data, pinned in package.json).
//
//   node tests/grafana/transform.mjs < request.json > result.json
//
// stdin:  {"frames": [{"refId", "name"?, "fields": [{"name", "type", "values", "config"?, "labels"?}]}],
//          "transformations": [...the panel's "transformations" array...]}
// stdout: {"frames": [{"refId", "name", "length",
//                      "fields": [{"name", "type", "displayName", "config", "labels", "values"}]}]}
//
// Number values may be given as the strings "NaN", "+Inf", "-Inf" (JSON has no literals for them);
// on output, JSON turns NaN and the infinities into null. Errors go to stderr with exit status 1.

// @grafana/data reads window.grafanaBootData while it loads; in Node there is no window.
globalThis.window ??= globalThis;

const { createRequire } = await import('node:module');
const require = createRequire(import.meta.url);
const data = require('@grafana/data');

// Grafana's app fills this registry at start-up (public/app/features/transformers); the
// transformations themselves live in @grafana/data. seriesToColumns is an alias of joinByField.
const transformers = new Map();
for (const transformer of Object.values(data.standardTransformers)) {
  transformers.set(transformer.id, transformer);
}
data.standardTransformersRegistry.setInit(() =>
  [...transformers.values()].map((t) => ({ id: t.id, name: t.name, description: t.description, transformation: t })),
);

function toNumber(value) {
  if (typeof value !== 'string') {
    return value;
  }
  if (/^[+-]?inf(inity)?$/i.test(value)) {
    return value.startsWith('-') ? -Infinity : Infinity;
  }
  return Number(value);
}

function firstValue(observable) {
  return new Promise((resolve, reject) => {
    let done = false;
    const subscription = observable.subscribe({
      next: (value) => {
        if (!done) {
          done = true;
          resolve(value);
        }
      },
      error: reject,
      complete: () => done || reject(new Error('the transformations emitted nothing')),
    });
    if (done) {
      subscription.unsubscribe();
    }
  });
}

let input = '';
for await (const chunk of process.stdin) {
  input += chunk;
}
const request = JSON.parse(input);

const frames = request.frames.map((frame) =>
  data.toDataFrame({
    refId: frame.refId,
    name: frame.name,
    fields: frame.fields.map((field) => ({
      name: field.name,
      type: field.type,
      config: field.config ?? {},
      labels: field.labels,
      values: field.type === 'number' ? field.values.map(toNumber) : field.values,
    })),
  }),
);

const transformations = request.transformations ?? [];
for (const t of transformations) {
  if (!transformers.has(t.id)) {
    throw new Error(`unknown transformation id ${JSON.stringify(t.id)}: not in @grafana/data ${require('@grafana/data/package.json').version}`);
  }
}

const output = await firstValue(data.transformDataFrame(transformations, frames));

process.stdout.write(
  JSON.stringify({
    frames: output.map((frame) => ({
      refId: frame.refId ?? null,
      name: frame.name ?? null,
      length: frame.length,
      fields: frame.fields.map((field) => ({
        name: field.name,
        type: field.type,
        displayName: data.getFieldDisplayName(field, frame, output),
        config: field.config ?? {},
        labels: field.labels ?? null,
        values: Array.from(field.values),
      })),
    })),
  }),
);
