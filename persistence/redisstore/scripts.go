package redisstore

import "github.com/redis/go-redis/v9"

// The scripts that make each group operation one atomic step. Every write
// checks the caller's epoch against the group's first, in the same script,
// so no write of a fenced-off owner can land after a claim: in formats 1
// and 2 by reading the epoch from the group's meta; a format 3 append by
// writing to the log named after its epoch, which a claim renames. In
// format 3 the host's appends of one record per group and every checkpoint
// need no script (Store.Append, Store.checkpointWatched).
// Redis runs scripts one at a time; Lua numbers are doubles, exact for
// positions and epochs below 2^53.

// claimScript bumps the group's epoch and returns {epoch, checkpoint, last}.
//
//	KEYS[1] group meta
var claimScript = redis.NewScript(`
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
local v = redis.call('HMGET', KEYS[1], 'checkpoint', 'last')
return {epoch, tonumber(v[1] or '0'), tonumber(v[2] or '0')}
`)

// appendScript appends records to the group's log and returns the position
// of the last one; it appends nothing and returns -1 if the epoch is not
// current, or -2 if the group's last position is not the expected one (so a
// call that the client sends again, after a timeout or a redirection, never
// appends twice).
//
//	KEYS[1] group meta, KEYS[2] group log
//	ARGV[1] epoch, ARGV[2] expected last position ("" for any), ARGV[3…]
//	        the records
var appendScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'epoch', 'last')
if v[1] ~= ARGV[1] then return -1 end
if ARGV[2] ~= '' and (v[2] or '0') ~= ARGV[2] then return -2 end
local last = tonumber(v[2] or '0')
for i = 3, #ARGV do
  last = last + 1
  redis.call('XADD', KEYS[2], string.format('%d-0', last), 'd', ARGV[i])
end
redis.call('HSET', KEYS[1], 'last', string.format('%d', last))
return last
`)

// appendManyScript is appendScript for several groups in one call, for a
// single Redis (not a cluster, where a script may only touch one slot). It
// returns one result per group, as appendScript does.
//
//	KEYS[2i-1], KEYS[2i] group i's meta and log
//	ARGV per group: epoch, expected last position ("" for any), the number
//	of records n, then the n records
var appendManyScript = redis.NewScript(`
local out = {}
local a = 1
for g = 1, #KEYS / 2 do
  local meta, log = KEYS[2 * g - 1], KEYS[2 * g]
  local epoch, expect, n = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  local first = a + 3
  a = first + n
  local v = redis.call('HMGET', meta, 'epoch', 'last')
  if v[1] ~= epoch then
    out[g] = -1
  elseif expect ~= '' and (v[2] or '0') ~= expect then
    out[g] = -2
  else
    local last = tonumber(v[2] or '0')
    for i = first, a - 1 do
      last = last + 1
      redis.call('XADD', log, string.format('%d-0', last), 'd', ARGV[i])
    end
    redis.call('HSET', meta, 'last', string.format('%d', last))
    out[g] = last
  end
end
return out
`)

// checkpointScript writes and deletes snapshots, sets and removes timer
// index entries and, if the position is above the group's checkpoint,
// advances it and trims the log through it. It returns 0, -1 (writing
// nothing) if the epoch is not current, or -2 (writing nothing) if the
// position is beyond the last one.
//
//	KEYS[1] group meta, KEYS[2] group log, KEYS[3] group timer index,
//	        KEYS[4…] snapshot keys: the ARGV[3] written ones first, then
//	        the deleted ones
//	ARGV[1] epoch, ARGV[2] checkpoint position, ARGV[3] number of written
//	        snapshots, ARGV[4…] their data, then pairs of a timer's key and
//	        due time ("0" removes the key from the index), applied in order
//
// The snapshots are written by one MSET per thousand (unpack's bound is
// 8,000 values): a SET per snapshot cost Redis half as much again per
// snapshot (BenchmarkCheckpoint).
var checkpointScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'epoch', 'checkpoint', 'last')
if v[1] ~= ARGV[1] then return -1 end
local through = tonumber(ARGV[2])
if through > tonumber(v[3] or '0') then return -2 end
local nset = tonumber(ARGV[3])
local i = 1
while i <= nset do
  local kv, n = {}, 0
  for k = i, math.min(nset, i + 999) do
    kv[n + 1], kv[n + 2] = KEYS[3 + k], ARGV[3 + k]
    n = n + 2
  end
  redis.call('MSET', unpack(kv))
  i = i + n / 2
end
for i = 4 + nset, #KEYS do
  redis.call('DEL', KEYS[i])
end
for i = 4 + nset, #ARGV, 2 do
  if ARGV[i + 1] == '0' then
    redis.call('ZREM', KEYS[3], ARGV[i])
  else
    redis.call('ZADD', KEYS[3], ARGV[i + 1], ARGV[i])
  end
end
if through > tonumber(v[2] or '0') then
  redis.call('HSET', KEYS[1], 'checkpoint', ARGV[2])
  redis.call('XTRIM', KEYS[2], 'MINID', string.format('%d-0', through + 1))
end
return 0
`)

// checkGroupsScript records the layout version, number of groups and
// key-group layout in a new store (one without a number of groups, whose
// format a first group operation may have recorded already: see
// adoptFormatScript) and returns the stored {format, groups, layout}
// (layout false in a store created before it was recorded).
//
//	KEYS[1] store meta
//	ARGV[1] format version, ARGV[2] groups, ARGV[3] key-group layout
var checkGroupsScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], 'groups') == 0 then
  redis.call('HSETNX', KEYS[1], 'format', ARGV[1])
  redis.call('HSET', KEYS[1], 'groups', ARGV[2], 'keylayout', ARGV[3])
end
return redis.call('HMGET', KEYS[1], 'format', 'groups', 'keylayout')
`)

// adoptFormatScript records the layout version in a store that has none
// yet and returns the stored one: a group operation that comes before
// CheckGroups learns which layout the store's groups have, and fixes it in
// a new store.
//
//	KEYS[1] store meta
//	ARGV[1] format version
var adoptFormatScript = redis.NewScript(`
redis.call('HSETNX', KEYS[1], 'format', ARGV[1])
return redis.call('HGET', KEYS[1], 'format')
`)

// The scripts of format 3 (keys.go), whose group log is named after the
// group's epoch: a claim renames it, so an owner's append to its epoch's
// log (XADD NOMKSTREAM) finds no stream once another claimed the group,
// and no append reads or writes the group's meta.

// lastPosition is a Lua function returning the last position a format 3
// log was given (its last generated ID, kept after its entries are
// trimmed).
const lastPosition = `
local function lastPosition(log)
  local info = redis.call('XINFO', 'STREAM', log)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then
      return tonumber((string.match(info[i + 1], '^(%d+)-')))
    end
  end
  error('XINFO STREAM ' .. log .. ' has no last-generated-id')
end
`

// claimScript3 bumps the group's epoch from the expected one, moves its
// log to the new epoch's name (creating an empty log for a new group), and
// returns {epoch, checkpoint, last}; or {-1} if the epoch is not the
// expected one (another claim came first: read it and call again).
//
//	KEYS[1] group meta, KEYS[2] the log of the expected epoch, KEYS[3] the
//	        log of the next one
//	ARGV[1] the expected epoch
var claimScript3 = redis.NewScript(lastPosition + `
local v = redis.call('HMGET', KEYS[1], 'epoch', 'checkpoint')
if (v[1] or '0') ~= ARGV[1] then return {-1} end
local checkpoint = tonumber(v[2] or '0')
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('RENAME', KEYS[2], KEYS[3])
elseif checkpoint > 0 or v[1] then
  return redis.error_reply('the group log ' .. KEYS[2] .. ' is missing')
else
  redis.call('XADD', KEYS[3], '0-1', 'd', '')
  redis.call('XDEL', KEYS[3], '0-1')
end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
return {epoch, checkpoint, lastPosition(KEYS[3])}
`)

// appendGroup3 is a Lua function appending a group's records to its
// format 3 log: ARGV[first…last] after position expect ("" for the log's
// last), returning the position of the last record, -1 if the log is not
// there (its epoch is not current), -2 if its last position is above the
// expected one (a call sent twice, or after one whose outcome was unknown
// and which landed). A last position below the expected one (records Redis
// lost) is not detected: the records go after the gap (keys.go).
const appendGroup3 = lastPosition + `
local function appendGroup(log, expect, first, last)
  local pos
  if expect == '' then
    if redis.call('EXISTS', log) == 0 then return -1 end
    pos = lastPosition(log)
  else
    pos = tonumber(expect)
  end
  local r = redis.pcall('XADD', log, 'NOMKSTREAM', string.format('%d-0', pos + 1), 'd', ARGV[first])
  if not r then return -1 end
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'equal or smaller', 1, true) then return -2 end
    return r
  end
  pos = pos + 1
  for i = first + 1, last do
    pos = pos + 1
    redis.call('XADD', log, string.format('%d-0', pos), 'd', ARGV[i])
  end
  return pos
end
`

// appendScript3 is appendScript for format 3.
//
//	KEYS[1] the log of the caller's epoch
//	ARGV[1] expected last position ("" for any), ARGV[2…] the records
var appendScript3 = redis.NewScript(appendGroup3 + `
return appendGroup(KEYS[1], ARGV[1], 2, #ARGV)
`)

// appendManyScript3 is appendManyScript for format 3.
//
//	KEYS[i] group i's log of the caller's epoch
//	ARGV per group: expected last position ("" for any), the number of
//	records n, then the n records
var appendManyScript3 = redis.NewScript(appendGroup3 + `
local out = {}
local a = 1
for g = 1, #KEYS do
  local expect, n = ARGV[a], tonumber(ARGV[a + 1])
  local first = a + 2
  a = first + n
  local r = appendGroup(KEYS[g], expect, first, a - 1)
  if type(r) == 'table' then return r end
  out[g] = r
end
return out
`)
