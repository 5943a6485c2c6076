package redistest

import "github.com/ratelimit-proxy/ratelimit-proxy/limits"

// SlotCount is the number of hash slots of a Redis Cluster.
const SlotCount = limits.SlotCount

// Slot is the hash slot of key, as Redis computes it (see limits.Slot).
func Slot(key string) int { return limits.Slot(key) }
