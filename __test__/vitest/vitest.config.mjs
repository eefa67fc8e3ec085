// The host-style suite (vitest, as the plugin's own suite): `npm run test:vitest`.
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    root: new URL('.', import.meta.url).pathname,
    include: ['**/*.test.mjs'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
  },
})
