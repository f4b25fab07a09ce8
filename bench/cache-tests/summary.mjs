// Classifies results of the HTTP cache test suite (cache-tests.fyi) by the suite's
// own rules: a test whose dependency did not pass counts as a dependency failure; a
// required test (kind `required` or none) that fails is a required failure, an
// `optimal` one an optional failure, a `check` one only a yes/no.
//
// usage: node summary.mjs SUITE_DIR [--allow FILE] [--list NAME] NAME=results.json...
// Prints one line per results file: passes, required failures, required failures
// not in the --allow file (one test id per line, `#` comments), optional failures,
// dependency, setup and harness failures; with --list NAME, NAME's failing tests on
// stderr.

import path from 'node:path'
import fs from 'node:fs'
import { pathToFileURL } from 'node:url'

const [suiteDir, ...args] = process.argv.slice(2)
const load = async (rel) => (await import(pathToFileURL(path.join(suiteDir, rel)).href)).default
const suites = await load('tests/index.mjs')
// The npm release's command line runs this suite too, beside the index.
const surrogate = path.join(suiteDir, 'tests/surrogate-control.mjs')
if (fs.existsSync(surrogate) && !suites.some(s => s.id === 'surrogate-control')) {
  suites.push(await load('tests/surrogate-control.mjs'))
}

const tests = new Map()
for (const suite of suites) for (const t of suite.tests) tests.set(t.id, t)

function classify (id, results, seen = new Set()) {
  const test = tests.get(id)
  const result = results[id]
  if (result === undefined) return 'untested'
  for (const dep of test.depends_on || []) {
    if (seen.has(dep)) continue
    seen.add(dep)
    if (!['pass', 'yes'].includes(classify(dep, results, seen))) return 'dependency_fail'
  }
  if (Array.isArray(result) && result[0] === 'Setup') return result[1] === 'retry' ? 'retry' : 'setup_fail'
  if (Array.isArray(result) && result[0] === 'AbortError') return 'harness_fail'
  const kind = test.kind || 'required'
  if (kind === 'required') return result === true ? 'pass' : 'fail'
  if (kind === 'optimal') return result === true ? 'pass' : 'optional_fail'
  return result === true ? 'yes' : 'no'
}

let list = null
let allowed = new Set()
const files = []
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--list') list = args[++i]
  else if (args[i] === '--allow') {
    allowed = new Set(fs.readFileSync(args[++i], 'utf8').split('\n')
      .map(l => l.replace(/#.*/, '').trim()).filter(l => l))
  } else files.push(args[i])
}
console.log(['implementation', 'pass', 'required-fail', 'counted-fail', 'optional-fail', 'dependency-fail', 'setup-fail', 'harness-fail', 'tests'].join('\t'))
for (const arg of files) {
  const [name, file] = arg.includes('=') ? arg.split('=') : [path.basename(arg, '.json'), arg]
  const results = JSON.parse(fs.readFileSync(file, 'utf8'))
  const counts = {}
  const failing = []
  for (const id of tests.keys()) {
    const c = classify(id, results)
    counts[c] = (counts[c] || 0) + 1
    if (c === 'fail' || c === 'optional_fail') failing.push(`${c}\t${id}\t${tests.get(id).name}`)
  }
  const counted = failing.filter(f => f.startsWith('fail\t') && !allowed.has(f.split('\t')[1])).length
  console.log([name, counts.pass || 0, counts.fail || 0, counted, counts.optional_fail || 0,
    counts.dependency_fail || 0, counts.setup_fail || 0, counts.harness_fail || 0, tests.size].join('\t'))
  if (list === name) for (const f of failing) console.error(f)
}
