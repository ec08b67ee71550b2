package partition

import (
	"fmt"
	"testing"
)

func TestAssign(t *testing.T) {
	t.Parallel()
	all, err := Assign(4, nil)
	if err != nil || fmt.Sprint(all) != "[0 1 2 3]" {
		t.Fatalf("Assign(4, nil) = %v, %v", all, err)
	}
	got, err := Assign(8, []int{5, 1, 5})
	if err != nil || fmt.Sprint(got) != "[1 5]" {
		t.Fatalf("Assign(8, [5 1 5]) = %v, %v", got, err)
	}
	for _, bad := range [][]int{{8}, {-1}} {
		if _, err := Assign(8, bad); err == nil {
			t.Errorf("Assign(8, %v) accepted a partition outside [0, 8)", bad)
		}
	}
	if _, err := Assign(0, nil); err == nil {
		t.Error("Assign(0, nil) accepted no partitions")
	}
}
