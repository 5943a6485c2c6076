//go:build !linux

package limits_test

import "time"

func processCPU(int) (time.Duration, bool) { return 0, false }

func selfCPU() (time.Duration, bool) { return 0, false }
