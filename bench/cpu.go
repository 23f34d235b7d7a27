package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPUUse says where a measurement's CPU time went, in cores (CPU seconds
// per second of wall time): the benchmark process (relays, writers,
// consumers and, without KAFKA_BROKERS, the kfake broker), a JVM broker on
// this machine, and the rest (PostgreSQL's processes, and anything else the
// machine ran). Busy is the fraction of all the machine's cores in use.
type CPUUse struct {
	Cores    int     `json:"cores"`
	Busy     float64 `json:"machine_busy"`
	Bench    float64 `json:"bench_cores"`
	Broker   float64 `json:"jvm_broker_cores,omitempty"`
	Postgres float64 `json:"postgres_and_rest_cores"`
}

type cpuSample struct {
	at          time.Time
	busy, total float64 // machine, in clock ticks
	self, java  float64 // seconds
}

// clockTick is USER_HZ, 100 on every Linux architecture Go supports.
const clockTick = 100.0

func sampleCPU() cpuSample {
	s := cpuSample{at: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := bytes.Cut(b, []byte("\n"))
		f := strings.Fields(string(line))
		for i, v := range f[1:] {
			x, _ := strconv.ParseFloat(v, 64)
			if i >= 8 { // guest time is already counted in user
				break
			}
			s.total += x
			if i != 3 && i != 4 { // idle, iowait
				s.busy += x
			}
		}
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		open, close := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if open < 0 || close < open || string(b[open+1:close]) != "java" {
			continue
		}
		f := strings.Fields(string(b[close+1:]))
		if len(f) > 12 {
			u, _ := strconv.ParseFloat(f[11], 64)
			k, _ := strconv.ParseFloat(f[12], 64)
			s.java += (u + k) / clockTick
		}
	}
	return s
}

func (a cpuSample) until(b cpuSample) *CPUUse {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 || b.total <= a.total {
		return nil
	}
	cores := 0
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "cpu") && !strings.HasPrefix(l, "cpu ") {
				cores++
			}
		}
	}
	busy := (b.busy - a.busy) / (b.total - a.total)
	u := &CPUUse{Cores: cores, Busy: round3(busy), Bench: round2((b.self - a.self) / wall), Broker: round2((b.java - a.java) / wall)}
	u.Postgres = round2(max(0, busy*float64(cores)-u.Bench-u.Broker))
	return u
}
